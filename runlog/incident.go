package runlog

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/memsnap/memsnap/internal/store"
)

// An incident is a snapshot a rank's trainer took when it hit an OOM or was
// stopped. Its rank writes it into the log once stored, under
//
//	incidents/rank{R}/at{unix microseconds}.json
//
// so that a post-mortem finds it by reading the log, whoever leads and however
// late, not only through a hand-over while the rank still lives.

// IncidentKey names rank's incident record at time at.
func (l *Log) IncidentKey(rank int, at time.Time) string {
	return l.incidentsKey(rank) + "at" + strconv.FormatInt(at.UnixMicro(), 10) + ".json"
}

func (l *Log) incidentsKey(rank int) string {
	return l.root + "incidents/rank" + strconv.Itoa(rank) + "/"
}

// PutIncident records rank r.Rank's incident snapshot (r.Window is the window it
// was recording, or 0; r.At when it was stored). Writing it again replaces it.
func (l *Log) PutIncident(ctx context.Context, r Report) error {
	r.prepare()
	if err := r.checkIncident(); err != nil {
		return err
	}
	return l.put(ctx, l.IncidentKey(r.Rank, r.At), r, store.PutOptions{Overwrite: true})
}

// prepare stamps a report to be written: its version, its time (now when it
// has none), its texts cut to their bounds.
func (r *Report) prepare() {
	r.Version = Version
	if r.At.IsZero() {
		r.At = time.Now().UTC()
	}
	r.Partial, r.Error, r.Cause = Cut(r.Partial, MaxError), Cut(r.Error, MaxError), Cut(r.Cause, MaxError)
}

func (r *Report) checkIncident() error {
	if r.Reason != "oom" && r.Reason != "crash" {
		return bad("an incident of reason %q", r.Reason)
	}
	w := *r
	w.Window = 1 // an incident may belong to no window
	return w.check()
}

// Incidents lists rank's incidents stored between from and to (inclusive),
// oldest first. A record that does not parse is left out and named in the list
// returned beside; a store that fails to read one is an error.
func (l *Log) Incidents(ctx context.Context, rank int, from, to time.Time) ([]*Report, []error, error) {
	return l.incidents(ctx, l.incidentsKey(rank), from, to)
}

// AllIncidents lists every rank's incidents stored between from and to, oldest
// first, as Incidents does.
func (l *Log) AllIncidents(ctx context.Context, from, to time.Time) ([]*Report, []error, error) {
	return l.incidents(ctx, l.root+"incidents/", from, to)
}

// incidents reads the incident records under prefix stored between from and to.
func (l *Log) incidents(ctx context.Context, prefix string, from, to time.Time) ([]*Report, []error, error) {
	objs, err := l.st.List(ctx, prefix)
	if err != nil {
		return nil, nil, err
	}
	var out []*Report
	var bad []error
	for _, o := range objs {
		rank, us, ok := l.incidentName(o.Key)
		if !ok || us < from.UnixMicro() || us > to.UnixMicro() {
			continue
		}
		r, err := l.readIncident(ctx, o.Key, rank)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case errors.Is(err, ErrMalformed):
			bad = append(bad, err)
		case err != nil:
			return nil, nil, err
		default:
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out, bad, nil
}

// incidentName reads incidents/rank{R}/at{microseconds}.json.
func (l *Log) incidentName(key string) (rank int, us int64, ok bool) {
	rest, ok := strings.CutPrefix(key, l.root+"incidents/")
	if !ok {
		return 0, 0, false
	}
	dir, name, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, 0, false
	}
	r, ok := parseName(dir+".json", "rank")
	if !ok || r >= maxRanks {
		return 0, 0, false
	}
	t, ok := parseName(name, "at") // (microseconds, well within MaxID until the year 2255)
	return int(r), int64(t), ok
}

func (l *Log) readIncident(ctx context.Context, key string, rank int) (*Report, error) {
	b, err := l.read(ctx, key)
	if err != nil {
		return nil, err
	}
	var r Report
	if err := decodeStrict(b, &r); err != nil {
		return nil, err
	}
	if r.Version != Version || r.Rank != rank {
		return nil, fmt.Errorf("%w: %s is version %d of rank %d", ErrMalformed, key, r.Version, r.Rank)
	}
	if err := r.checkIncident(); err != nil {
		return nil, err
	}
	return &r, nil
}

// UnfinishedIDs lists the windows with a plan and no outcome (or whose outcome
// slot a newer term claimed), oldest first; it only reads (Unfinished may
// finish a void or malformed plan).
func (l *Log) UnfinishedIDs(ctx context.Context) ([]uint64, error) {
	low := MaxID + 1
	h, _, err := l.readHead(ctx)
	switch {
	case err == nil:
		low = h.Low
	case !errors.Is(err, store.ErrNotFound):
		return nil, err
	}
	return l.unfinishedIDs(ctx, low)
}
