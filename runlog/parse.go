package runlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// maxText bounds a free-text field (a reason, a cause, an error) and a key.
const maxText = 4096

// Every record read from the store is untrusted: anyone who can write the bucket
// can write the log. The parsers refuse unknown fields, wrong versions and values
// out of range, with the reason. A plan of a newer version is read for the fields
// this version knows (its fields beyond them are left out), not refused.

func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: more than one value", ErrMalformed)
	}
	return nil
}

// decodeRecord decodes b strictly into a new T, of this version; what names the
// record in the error.
func decodeRecord[T any](b []byte, what string, version func(*T) int) (*T, error) {
	var v T
	if err := decodeStrict(b, &v); err != nil {
		return nil, err
	}
	if n := version(&v); n != Version {
		return nil, bad("%s version %d", what, n)
	}
	return &v, nil
}

func bad(what string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(what, a...))
}

func checkText(fields ...string) error {
	for _, s := range fields {
		if len(s) > maxText || !utf8.ValidString(s) {
			return bad("a text field of %d bytes", len(s))
		}
	}
	return nil
}

func checkKind(k string) error {
	switch k {
	case KindWindow, KindOOM, KindCrash, KindTrigger:
		return nil
	}
	return bad("kind %q", k)
}

// ParseTerm parses and checks a term record.
func ParseTerm(b []byte) (*Term, error) {
	t, err := decodeRecord(b, "term", func(t *Term) int { return t.Version })
	if err != nil {
		return nil, err
	}
	switch {
	case t.Term == 0 || t.Term > MaxID:
		return nil, bad("term %d", t.Term)
	case t.Rank < -1 || t.Rank >= maxRanks:
		return nil, bad("term leader rank %d", t.Rank)
	}
	return t, checkText(t.Leader)
}

// decodeVersioned decodes b into v, strictly unless its version is newer than
// this one's: a newer record may hold fields this version does not know.
func decodeVersioned(b []byte, v any) error {
	var head struct {
		Version int `json:"version"`
	}
	if json.Unmarshal(b, &head) == nil && head.Version > Version {
		if err := json.Unmarshal(b, v); err != nil {
			return fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		return nil
	}
	return decodeStrict(b, v)
}

// ParsePlan parses and checks a plan. A plan of a newer version is read for what
// this version knows (its kind may be one this version does not know); one of
// an older or no version is malformed.
func ParsePlan(b []byte) (*Plan, error) {
	var p Plan
	if err := decodeVersioned(b, &p); err != nil {
		return nil, err
	}
	switch {
	case p.Version < Version:
		return nil, bad("plan version %d", p.Version)
	case p.Void != "" && (p.ID == 0 || p.ID > MaxID || p.Term > MaxID):
		return nil, bad("void plan of window %d, term %d", p.ID, p.Term)
	case p.Void != "":
		return &p, checkText(p.Void)
	case p.ID == 0 || p.ID > MaxID || p.Term > MaxID:
		return nil, bad("plan of window %d, term %d", p.ID, p.Term)
	case p.WorldSize <= 0 || p.WorldSize > maxRanks:
		return nil, bad("plan for world size %d", p.WorldSize)
	case p.LeaderRank < 0 || p.LeaderRank >= p.WorldSize:
		return nil, bad("plan led by rank %d of %d", p.LeaderRank, p.WorldSize)
	case p.Start < 0 || p.Stop < p.Start || (p.Kind == KindWindow && p.Stop == p.Start):
		return nil, bad("plan for batches [%d, %d)", p.Start, p.Stop)
	case len(p.Ranks) > p.WorldSize:
		return nil, bad("plan for %d ranks of %d", len(p.Ranks), p.WorldSize)
	case p.Dump && (p.Start != 0 || p.Stop != 0 || p.Kind == KindWindow):
		return nil, bad("a plan of dumps of kind %q for batches [%d, %d)", p.Kind, p.Start, p.Stop)
	case p.FailedRank != nil && (*p.FailedRank < 0 || *p.FailedRank >= p.WorldSize):
		return nil, bad("plan naming rank %d of %d", *p.FailedRank, p.WorldSize)
	}
	if err := checkKind(p.Kind); err != nil && p.Version == Version {
		return nil, err
	}
	for i, r := range p.Ranks {
		if r < 0 || r >= p.WorldSize || (i > 0 && r <= p.Ranks[i-1]) {
			return nil, bad("plan ranks are not increasing ranks of the world")
		}
	}
	for k, a := range p.Agents {
		r, err := strconv.Atoi(k)
		if err != nil || strconv.Itoa(r) != k || r < 0 || r >= p.WorldSize || len(a) > 32 {
			return nil, bad("plan naming rank %q's agent", k)
		}
	}
	return &p, checkText(p.Run, p.Leader, p.Reason, p.Manifest, p.Cause, p.Request, p.Kind)
}

// ParseReport parses and checks a rank's report.
func ParseReport(b []byte) (*Report, error) {
	r, err := decodeRecord(b, "report", func(r *Report) int { return r.Version })
	if err != nil {
		return nil, err
	}
	return r, r.check()
}

func (r *Report) check() error {
	switch {
	case r.Window == 0 || r.Window > MaxID:
		return bad("report of window %d", r.Window)
	case r.Rank < 0 || r.Rank >= maxRanks:
		return bad("report of rank %d", r.Rank)
	case r.Size < 0 || r.Events < 0 || r.Start < 0 || r.Stop < 0:
		return bad("report with negative figures")
	case r.Error == "" && r.Key == "":
		return bad("a report with neither a snapshot nor an error")
	}
	switch r.Reason {
	case "", "window", "oom", "postmortem", "crash":
	default:
		return bad("report reason %q", r.Reason)
	}
	return checkText(r.Key, r.MetaKey, r.AnalysisKey, r.SHA256, r.Partial, r.Error, r.Cause)
}

// ParseOutcome parses and checks how a window ended.
func ParseOutcome(b []byte) (*Outcome, error) {
	o, err := decodeRecord(b, "outcome", func(o *Outcome) int { return o.Version })
	if err != nil {
		return nil, err
	}
	switch {
	case o.ID == 0 || o.ID > MaxID || o.Term > MaxID:
		return nil, bad("outcome of window %d, term %d", o.ID, o.Term)
	case o.State != Published && o.State != Failed && o.State != claimed:
		return nil, bad("outcome state %q", o.State)
	case o.State == Published && o.Manifest == "":
		return nil, bad("a published outcome without a manifest")
	case len(o.Ranks) > maxRanks || len(o.Missing) > maxRanks:
		return nil, bad("an outcome naming too many ranks")
	}
	if o.Kind != "" {
		if err := checkKind(o.Kind); err != nil {
			return nil, err
		}
	}
	for _, r := range o.Ranks {
		if r < 0 || r >= maxRanks {
			return nil, bad("outcome naming rank %d", r)
		}
	}
	for k, why := range o.Missing {
		if n, err := strconv.Atoi(k); err != nil || n < 0 || n >= maxRanks || strconv.Itoa(n) != k {
			return nil, bad("outcome naming rank %q", k)
		}
		if err := checkText(why); err != nil {
			return nil, err
		}
	}
	return o, checkText(o.Manifest, o.Error, o.Leader)
}
