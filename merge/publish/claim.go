package publish

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/memsnap/memsnap/internal/digest"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/naming"
)

// A cluster's window is committed by its manifest, created once. A leader
// checks its term (Config.Fence) before it creates one, but a leader that
// passes the check and stalls could create it after a newer term took the
// window over. So a term taking over an unfinished window first claims its
// manifest's key: it stores a claim there (a manifest of State
// ManifestClaimed), created once, or replacing an older term's claim. A claim
// reads as no manifest (ErrClaimed wraps store.ErrNotFound); a commit replaces
// a claim of its own term or an older one (If-Match on the claim's version),
// and a claim of a newer term refuses it (ErrNewerClaim). A stale leader's
// commit then either lands before the claim, while its term was still the
// newest, or not at all.

// ManifestClaimed is the State of a claim on a window's commit point.
const ManifestClaimed = "claimed"

// ErrClaimed: the store holds only a term's claim under a manifest's key: no
// commit (it wraps store.ErrNotFound, so readers take it for none).
var ErrClaimed = fmt.Errorf("merge: the window's commit point holds only a leadership term's claim: %w", store.ErrNotFound)

// ErrNewerClaim: a newer leadership term claimed the window's commit point;
// the commit tried is stale and is refused.
var ErrNewerClaim = errors.New("merge: a newer leadership term claimed the window's commit")

// AttemptOf names term's publications ("t7"), as a claim and a commit carry it.
func AttemptOf(term uint64) string { return "t" + strconv.FormatUint(term, 10) }

// termOf is the term of an attempt named AttemptOf (0 for any other name: a
// merge outside a cluster).
func termOf(attempt string) uint64 {
	n, err := strconv.ParseUint(strings.TrimPrefix(attempt, "t"), 10, 64)
	if err != nil || !strings.HasPrefix(attempt, "t") || AttemptOf(n) != attempt {
		return 0
	}
	return n
}

// ClaimCommit stores term's claim on the commit point of window id (of world
// ranks) under key: created once, or replacing an older term's claim. A commit
// there already, or a claim of this term or a newer one, is left as it is.
func ClaimCommit(ctx context.Context, st store.Store, key string, term, id uint64, world int) error {
	m := &Manifest{Version: 1, State: ManifestClaimed, Attempt: AttemptOf(term), Outputs: map[string]Object{}, WorldSize: world,
		RanksMerged: []int{}, MissingRanks: []int{}, ClockOffsetsUS: map[string]int64{}, Window: &sidecar.WindowInfo{ID: id}}
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	mb = append(mb, '\n')
	if _, err := naming.CleanKey(key); err != nil {
		return fmt.Errorf("%w: %w", ErrUnclaimable, err)
	}
	ifMatch, vanished := "", 0
	for try := 0; try < 4; try++ {
		opts := store.PutOptions{Size: int64(len(mb)), SHA256: digest.SHA256Hex(mb), IfMatch: ifMatch, ContentType: contentType(OutManifest)}
		_, err = st.Put(ctx, key, bytes.NewReader(mb), opts)
		if !errors.Is(err, store.ErrExists) && !errors.Is(err, store.ErrChanged) {
			return err
		}
		cur, etag, rerr := readCommitClaim(ctx, st, key)
		switch {
		case errors.Is(rerr, store.ErrNotFound):
			// removed meanwhile: create it; a key that exists to a create and
			// not to a read (a folder there, in a folder store) is no commit
			// point anyone can write
			if vanished++; vanished > 1 {
				return fmt.Errorf("%w: %s exists to a create and not to a read", ErrUnclaimable, key)
			}
			ifMatch = ""
			continue
		case errors.Is(rerr, errNotCommitClaim) || errors.Is(rerr, errMalformed) || errors.Is(rerr, store.ErrTooLarge):
			return nil // a commit, or what no reader takes for one: not a claim to replace
		case rerr != nil:
			return rerr // (a read that failed: the claim is not known to hold)
		case termOf(cur.Attempt) >= term:
			return nil
		}
		ifMatch = etag
	}
	return fmt.Errorf("merge: claiming %s: other writers kept replacing it", key)
}

// ErrUnclaimable: a commit point no writer can use (a key the store refuses):
// there is nothing to claim, and no commit can be made there either.
var ErrUnclaimable = errors.New("merge: a commit point that cannot be written")

// errMalformed marks what is under a manifest's key and does not parse.
var errMalformed = errors.New("merge: not a manifest")

// readCommitClaim reads the claim under key with its version; an error when what is
// there is not a claim (errNotCommitClaim), or cannot be read.
func readCommitClaim(ctx context.Context, st store.Store, key string) (*Manifest, string, error) {
	m, etag, err := readManifestOrClaim(ctx, st, key)
	if err == nil && m.State != ManifestClaimed {
		err = errNotCommitClaim
	}
	if err != nil {
		return nil, "", err
	}
	return m, etag, nil
}

var errNotCommitClaim = errors.New("merge: not a claim")
