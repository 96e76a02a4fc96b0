package runlog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/memsnap/memsnap/internal/store"
)

// A window planned for a member's request is noted under
//
//	requests/{SHA-256 of the request's id}.json
//
// so that a leader that meets the request again (the member asked again, or
// another leader stalled with it) finds the window that serves it in one read,
// however many windows were planned since.

// served is a request's note: the window that serves it.
type served struct {
	Version int    `json:"version"`
	Request string `json:"request"`
	Window  uint64 `json:"window"`
}

func (l *Log) requestKey(req string) string {
	sum := sha256.Sum256([]byte(req))
	return l.root + "requests/" + hex.EncodeToString(sum[:]) + ".json"
}

// NoteRequest notes that window id serves request req (once: a note there
// already stays).
func (l *Log) NoteRequest(ctx context.Context, req string, id uint64) error {
	if req == "" || id == 0 || id > MaxID {
		return fmt.Errorf("runlog: a note of request %q for window %d", req, id)
	}
	err := l.put(ctx, l.requestKey(req), served{Version: Version, Request: Cut(req, MaxReason), Window: id}, store.PutOptions{})
	if errors.Is(err, store.ErrExists) {
		return nil
	}
	return err
}

// RequestWindow is the window noted as serving request req (0 when none is).
func (l *Log) RequestWindow(ctx context.Context, req string) (uint64, error) {
	b, err := l.read(ctx, l.requestKey(req))
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var s served
	if err := decodeStrict(b, &s); err != nil || s.Version != Version || s.Window == 0 || s.Window > MaxID || s.Request != Cut(req, MaxReason) {
		return 0, fmt.Errorf("%w: %s", ErrMalformed, l.requestKey(req))
	}
	return s.Window, nil
}
