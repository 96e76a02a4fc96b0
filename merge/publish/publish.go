// Package publish is how a merge's outputs become published: the names of the
// outputs, the claim stored before them, and the manifest stored after them,
// the commit point that names every output with its checksum; and how a
// reader finds and reads what was published.
package publish

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/memsnap/memsnap/internal/digest"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/naming"
)

// InputRef is one input of a merge as the claim and the manifest record it.
type InputRef struct {
	Rank       int    `json:"rank"` // -1 for a merged timeline
	Source     string `json:"source"`
	Size       int64  `json:"size"`
	SHA256     string `json:"sha256"`
	MetaSHA256 string `json:"meta_sha256,omitempty"` // the sidecar's, when there is one
}

// Object is one stored output, named relative to the manifest's folder (where
// every output of a merge lies), so the manifest reads the same wherever the store
// is rooted.
type Object struct {
	Name   string `json:"name"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Claim is <base>.inputs.json, written before the outputs: the inputs and the
// options that decide every byte of them. A second merge under the same name
// proceeds only with the same claim, so it either finishes what the first started
// (identical outputs) or is refused; it never mixes its outputs with another's.
type Claim struct {
	Version   int                 `json:"version"`
	Inputs    []InputRef          `json:"inputs"`
	WorldSize int                 `json:"world_size"`
	Align     string              `json:"align"`
	Offsets   map[string]int64    `json:"offsets_us,omitempty"`
	Title     string              `json:"title,omitempty"`
	Outputs   map[string]string   `json:"outputs"`
	Window    *sidecar.WindowInfo `json:"window,omitempty"`
	// Attempt names the publication that made this claim (see Config.Attempt).
	Attempt string `json:"attempt,omitempty"`
	// MissingReasons are in the summary and the report, so they decide bytes too.
	MissingReasons map[string]string `json:"missing_reasons,omitempty"`
}

// ErrBadClaim: a stored claim does not parse.
var ErrBadClaim = errors.New("merge: malformed claim")

// ReadClaim reads the claim under key (store.ErrNotFound when there is none).
func ReadClaim(ctx context.Context, st store.Store, key string) (*Claim, error) {
	b, _, err := store.ReadObject(ctx, st, key, maxManifest)
	if err != nil && !errors.Is(err, store.ErrTooLarge) {
		return nil, err
	}
	var c Claim
	if err != nil || json.Unmarshal(b, &c) != nil {
		return nil, fmt.Errorf("%w: %s", ErrBadClaim, key)
	}
	return &c, nil
}

// Manifest is <base>.manifest.json, written last: a merge is published once its
// manifest exists, and the manifest names every output with its checksum.
type Manifest struct {
	Version        int                 `json:"version"`
	Claim          Object              `json:"claim"`
	Outputs        map[string]Object   `json:"outputs"`
	Inputs         []InputRef          `json:"inputs"`
	Window         *sidecar.WindowInfo `json:"window,omitempty"`
	WorldSize      int                 `json:"world_size"`
	RanksMerged    []int               `json:"ranks_merged"`
	MissingRanks   []int               `json:"missing_ranks"`
	MissingReasons map[string]string   `json:"missing_reasons,omitempty"`
	// PartialRanks are merged ranks that recorded only part of the window (a
	// trainer stopped in its middle), and what each covers and why.
	PartialRanks   map[string]string `json:"partial_ranks,omitempty"`
	ClockOffsetsUS map[string]int64  `json:"clock_offsets_us"`
	Align          string            `json:"align"`
	Batches        []int64           `json:"batches,omitempty"` // the batches every rank recorded
	OutlierRank    *int              `json:"outlier_rank,omitempty"`
	Reason         string            `json:"reason,omitempty"` // why the window was recorded
	Kind           string            `json:"kind,omitempty"`   // window, oom or crash (a cluster's windows)
	Attempt        string            `json:"attempt,omitempty"`
	// Pickles are the merged pickles and the ranks each holds (names relative to
	// the manifest, as Outputs names them).
	Pickles []analysis.PicklePart `json:"pickles,omitempty"`
	// Findings say, a line each, what the merge found: how the peaks spread and
	// the summary's findings (see Summary.Answer), so a reader of the manifest
	// alone has the answer.
	Findings []string `json:"findings,omitempty"`
	// Pending names the outputs still being written (pickle, pb) by a merge
	// published in two steps: the outputs named are whole, and a later manifest
	// under the same name adds the pending ones.
	Pending []string `json:"pending,omitempty"`
	// DetailMissing are merged ranks whose full traces the pickles and the
	// timeline lack (a merge published in two steps could not decode their
	// snapshots after its answer), and why: their figures are in the summary.
	DetailMissing map[string]string `json:"detail_missing,omitempty"`
	// State is ManifestFailed for a window that ended with no outputs, Error
	// saying why; "" for a merge answered or published. A failed manifest is a
	// window's commit as a published one is: created once, never replaced.
	State string `json:"state,omitempty"`
	Error string `json:"error,omitempty"`
}

// ManifestFailed is the State of a failed window's manifest.
const ManifestFailed = "failed"

// Failed reports whether m commits a failed window.
func (m *Manifest) Failed() bool { return m.State == ManifestFailed }

// maxManifestError bounds a failed manifest's Error.
const maxManifestError = 4096

// ParseManifest parses a manifest, refusing malformed ones: every output (and the
// claim) must be a plain name in the manifest's folder with a size and a SHA-256,
// and every rank it names must lie in the world. Batches and missing reasons come
// back nil when empty, as a re-marshalled manifest (which omits them) reads.
func ParseManifest(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("merge: manifest: %w", err)
	}
	if m.Version != 1 {
		return nil, fmt.Errorf("merge: manifest version %d is not supported (1 is)", m.Version)
	}
	if m.WorldSize < 0 || m.WorldSize > sidecar.MaxRanks {
		return nil, fmt.Errorf("merge: manifest: world size %d", m.WorldSize)
	}
	for k, o := range m.Outputs {
		if !o.valid() {
			return nil, fmt.Errorf("merge: manifest: output %q is malformed", k)
		}
	}
	if m.Claim != (Object{}) && !m.Claim.valid() {
		return nil, fmt.Errorf("merge: manifest: the claim is malformed")
	}
	if err := m.checkRanks(); err != nil {
		return nil, err
	}
	if len(m.DetailMissing) == 0 {
		m.DetailMissing = nil
	}
	if len(m.Findings) > analysis.MaxManifestFindings {
		return nil, fmt.Errorf("merge: manifest: %d findings (at most %d)", len(m.Findings), analysis.MaxManifestFindings)
	}
	for _, f := range m.Findings {
		if len(f) > analysis.MaxFindingBytes { // (JSON makes it valid UTF-8)
			return nil, fmt.Errorf("merge: manifest: a finding of %d bytes (at most %d)", len(f), analysis.MaxFindingBytes)
		}
	}
	for _, k := range m.Pending {
		if k != OutPickle && k != OutPB {
			return nil, fmt.Errorf("merge: manifest: pending output %q (pickle or pb)", k)
		}
	}
	if len(m.Pending) > 2 {
		return nil, fmt.Errorf("merge: manifest: %d pending outputs", len(m.Pending))
	}
	if len(m.Pending) == 0 {
		m.Pending = nil
	}
	switch m.State {
	case "":
	case ManifestFailed:
		if len(m.Outputs) > 0 || len(m.Pending) > 0 || len(m.Pickles) > 0 || m.Claim != (Object{}) {
			return nil, fmt.Errorf("merge: manifest: a failed window's manifest names outputs")
		}
	case ManifestClaimed:
		if len(m.Outputs) > 0 || len(m.Pending) > 0 || len(m.Pickles) > 0 || m.Claim != (Object{}) || termOf(m.Attempt) == 0 {
			return nil, fmt.Errorf("merge: manifest: a claim names outputs, or no term")
		}
	default:
		return nil, fmt.Errorf("merge: manifest: state %q (failed, claimed, or none)", m.State)
	}
	if len(m.Error) > maxManifestError {
		return nil, fmt.Errorf("merge: manifest: an error of %d bytes (at most %d)", len(m.Error), maxManifestError)
	}
	if len(m.Findings) == 0 {
		m.Findings = nil
	}
	if len(m.MissingReasons) == 0 {
		m.MissingReasons = nil
	}
	if len(m.Pickles) == 0 {
		m.Pickles = nil
	}
	if len(m.Batches) == 0 {
		m.Batches = nil
	}
	return &m, nil
}

// checkRanks refuses a manifest naming a rank outside its world: in the ranks
// merged or missing, the outlier, the reasons, the ranks lacking detail, or a
// pickle's range.
func (m *Manifest) checkRanks() error {
	inWorld := func(r int) bool { return r >= 0 && r < sidecar.MaxRanks && (m.WorldSize == 0 || r < m.WorldSize) }
	for _, list := range [][]int{m.RanksMerged, m.MissingRanks} {
		for _, r := range list {
			if !inWorld(r) {
				return fmt.Errorf("merge: manifest: rank %d of world size %d", r, m.WorldSize)
			}
		}
	}
	if m.OutlierRank != nil && !inWorld(*m.OutlierRank) {
		return fmt.Errorf("merge: manifest: outlier rank %d of world size %d", *m.OutlierRank, m.WorldSize)
	}
	for k := range m.MissingReasons {
		if r, err := strconv.Atoi(k); err != nil || strconv.Itoa(r) != k || !inWorld(r) {
			return fmt.Errorf("merge: manifest: a reason for rank %q", k)
		}
	}
	for k, why := range m.DetailMissing {
		if r, err := strconv.Atoi(k); err != nil || strconv.Itoa(r) != k || !inWorld(r) || len(why) > analysis.MaxFindingBytes {
			return fmt.Errorf("merge: manifest: a rank lacking detail, %q", k)
		}
	}
	for k, why := range m.PartialRanks {
		if r, err := strconv.Atoi(k); err != nil || strconv.Itoa(r) != k || !inWorld(r) || len(why) > maxPartialReason {
			return fmt.Errorf("merge: manifest: a partial rank, %q", k)
		}
	}
	for _, p := range m.Pickles {
		if !(Object{Name: p.Name, SHA256: strings.Repeat("0", 64)}).valid() || p.FirstRank < 0 || p.LastRank < p.FirstRank || !inWorld(p.LastRank) || p.Bytes < 0 {
			return fmt.Errorf("merge: manifest: pickle %q is malformed", p.Name)
		}
	}
	return nil
}

// valid reports whether o names a plain file beside the manifest (no folder, no
// '.' or '..', nothing naming.CleanKey refuses) with a size and a SHA-256.
func (o Object) valid() bool {
	if o.Name == "." || o.Name == ".." || strings.ContainsAny(o.Name, "/\\") || o.Size < 0 || !digest.IsSHA256(o.SHA256) {
		return false
	}
	_, err := naming.CleanKey(o.Name)
	return err == nil
}

// Config is how a merge publishes: the store its outputs go to, whether they
// replace what is there, what its claim and its manifest record beside its
// inputs and its summary, and the fence asked before each commit. The fields
// are merge.Config's of the same names.
type Config struct {
	Out       store.Store
	Overwrite bool
	// Align, Offsets, Title and Window decide bytes of the outputs: the claim
	// records them.
	Align   string
	Offsets map[int]int64
	Title   string
	Window  *sidecar.WindowInfo
	// Reason and Kind say why the window was recorded and what it is, for the
	// manifest.
	Reason, Kind string
	// Attempt names this publication (see merge.Config.Attempt).
	Attempt string
	// Partial: merged ranks that recorded part of the window, and why.
	Partial map[int]string
	Logger  *slog.Logger
	// Fence, when set, is asked before the claim and every manifest are stored.
	Fence func(ctx context.Context) error
}

// putOnce stores a file under key unless the store holds it already with the same
// checksum; without overwrite, other content under key is an error wrapping
// store.ErrExists.
func putOnce(ctx context.Context, cfg *Config, key, file, sum string, kind string) (Object, error) {
	want := sum
	if _, local := cfg.Out.(*store.Dir); local {
		want = "" // the file was hashed as it was written; a folder store only moves it
	}
	info, err := store.PutFile(ctx, cfg.Out, key, file, store.PutOptions{Overwrite: cfg.Overwrite, SHA256: want, ContentType: contentType(kind)})
	if errors.Is(err, store.ErrExists) {
		st, serr := cfg.Out.Stat(ctx, key)
		if serr == nil && strings.EqualFold(st.SHA256, sum) {
			return Object{Name: path.Base(key), Size: st.Size, SHA256: sum}, nil
		}
		return Object{}, err
	}
	if err != nil {
		return Object{}, err
	}
	return Object{Name: path.Base(key), Size: info.Size, SHA256: sum}, nil
}

// Publish stores the claim, then every output, then the manifest.
func Publish(ctx context.Context, cfg *Config, keys map[string]string, tmp string, refs []InputRef, sum *analysis.Summary, outs []Output) (*Manifest, error) {
	// the claim is written locally first: a disk too full for it fails the
	// merge before an overwrite unpublishes anything
	cpath, csum, err := WriteClaim(cfg, tmp, refs, sum, outs)
	if err != nil {
		return nil, err
	}
	if cfg.Overwrite {
		// unpublish first: a reader never sees a manifest over outputs being replaced
		if err := cfg.Out.Delete(ctx, keys[OutManifest]); err != nil {
			return nil, err
		}
	}
	cobj, err := StoreClaim(ctx, cfg, keys, cpath, csum)
	if err != nil {
		return nil, err
	}
	man := ManifestOf(cfg, cobj, refs, sum)
	if err := StoreOutputs(ctx, cfg, &man, outs); err != nil {
		return nil, err
	}
	if err := PutManifest(ctx, cfg, keys[OutManifest], &man, ""); err != nil {
		if errors.Is(err, store.ErrExists) {
			Unpublish(ctx, cfg, keys[OutManifest], keys[OutInputs], outs)
			return nil, fmt.Errorf("merge: %s was published by another merge first: %w", keys[OutManifest], err)
		}
		if errors.Is(err, ErrFenced) {
			Unpublish(ctx, cfg, keys[OutManifest], keys[OutInputs], outs)
		}
		return nil, err
	}
	cfg.Logger.Info("published", "manifest", keys[OutManifest], "store", cfg.Out.String())
	return &man, nil
}

// StoreOutputs stores each output (unless the store holds it already, the same)
// and names it in the manifest, a merged pickle in its list of pickles too.
func StoreOutputs(ctx context.Context, cfg *Config, man *Manifest, outs []Output) error {
	for _, o := range outs {
		obj, err := putOnce(ctx, cfg, o.Key, o.File, o.Sum, o.Kind)
		if err != nil {
			return fmt.Errorf("merge: storing %s: %w", o.Key, err)
		}
		man.Outputs[o.Kind] = obj
		if o.Part != nil {
			p := *o.Part
			p.Name = obj.Name
			man.Pickles = append(man.Pickles, p)
		}
		cfg.Logger.Info("stored", "output", o.Key, "bytes", obj.Size, "store", cfg.Out.String())
	}
	return nil
}

// PutManifest stores a manifest, the merge's commit point (CommitManifest).
func PutManifest(ctx context.Context, cfg *Config, key string, man *Manifest, ifMatch string) error {
	_, err := CommitManifest(ctx, cfg.Out, key, man, ifMatch, cfg.fence)
	return err
}

// CommitManifest stores m under key, the commit point of a merge (and of a
// cluster's window), once fence (when not nil) allows it: created once, where
// the store holding the same bytes already is no error (a retry of the same
// commit), or replacing the version ifMatch names (a progressive merge's second
// step; store.ErrChanged when another merge replaced it first). Another manifest
// under key is an error wrapping store.ErrExists. It returns the stored version.
func CommitManifest(ctx context.Context, st store.Store, key string, m *Manifest, ifMatch string, fence func(context.Context) error) (string, error) {
	mb, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return "", err
	}
	mb = append(mb, '\n')
	if fence != nil {
		if err := fence(ctx); err != nil {
			return "", err
		}
	}
	sum := digest.SHA256Hex(mb)
	opts := store.PutOptions{Size: int64(len(mb)), SHA256: sum, IfMatch: ifMatch, ContentType: contentType(OutManifest)}
	info, err := st.Put(ctx, key, bytes.NewReader(mb), opts)
	if errors.Is(err, store.ErrExists) {
		if cur, serr := st.Stat(ctx, key); serr == nil && strings.EqualFold(cur.SHA256, sum) {
			return cur.ETag, nil
		}
	}
	if errors.Is(err, store.ErrExists) && ifMatch == "" {
		// a term's claim on the commit point: replaced by a commit of that term
		// or a newer one, never by an older term's
		if c, etag, cerr := readCommitClaim(ctx, st, key); cerr == nil {
			if termOf(c.Attempt) > termOf(m.Attempt) {
				return "", fmt.Errorf("%w: %w: %s is claimed by term %d, this commit is of %q", ErrFenced, ErrNewerClaim, key, termOf(c.Attempt), m.Attempt)
			}
			opts.IfMatch = etag
			info, err = st.Put(ctx, key, bytes.NewReader(mb), opts)
			if errors.Is(err, store.ErrChanged) {
				err = fmt.Errorf("%w: %w", store.ErrExists, err) // (another commit replaced the claim first)
			}
		}
	}
	if err != nil {
		return "", fmt.Errorf("merge: storing %s: %w", key, err)
	}
	return info.ETag, nil
}

// fence asks Config.Fence whether this merge may still commit.
func (c *Config) fence(ctx context.Context) error {
	if c.Fence == nil {
		return nil
	}
	if err := c.Fence(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrFenced, err)
	}
	return nil
}

// ErrFenced: Config.Fence refused the merge's commit; what the merge stored is
// removed (another merge's commit names none of it).
var ErrFenced = errors.New("merge: not publishing")

// FailedWindow is how a window ended with no outputs, for its manifest.
type FailedWindow struct {
	Error          string
	Window         *sidecar.WindowInfo
	WorldSize      int
	MissingReasons map[int]string
	Reason, Kind   string
	Attempt        string
}

// CommitFailed commits window f as failed: its manifest, under key, created once
// and only while fence allows. It returns the manifest the store holds under
// key afterwards: this one, or the one another leader committed first (a
// published window is never failed afterwards).
func CommitFailed(ctx context.Context, st store.Store, key string, f FailedWindow, fence func(context.Context) error) (*Manifest, error) {
	m := &Manifest{Version: 1, State: ManifestFailed, Error: cutReasonN(f.Error, maxManifestError), Outputs: map[string]Object{}, Window: f.Window,
		WorldSize: f.WorldSize, RanksMerged: []int{}, Reason: f.Reason, Kind: f.Kind, Attempt: f.Attempt, ClockOffsetsUS: map[string]int64{}}
	for r := 0; r < f.WorldSize; r++ {
		if why, ok := f.MissingReasons[r]; ok {
			m.MissingRanks = append(m.MissingRanks, r)
			if m.MissingReasons == nil {
				m.MissingReasons = map[string]string{}
			}
			m.MissingReasons[strconv.Itoa(r)] = CutReason(why)
		}
	}
	if m.MissingRanks == nil {
		m.MissingRanks = []int{}
	}
	if outer := fence; outer != nil {
		fence = func(ctx context.Context) error {
			if err := outer(ctx); err != nil {
				return fmt.Errorf("merge: not committing the window as failed: %w", err)
			}
			return nil
		}
	}
	_, err := CommitManifest(ctx, st, key, m, "", fence)
	if errors.Is(err, store.ErrExists) {
		return ReadManifest(ctx, st, key)
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Unpublish removes, after another merge published first (or the fence refused
// this one's commit), what this one stored and the published manifest, if any,
// does not name (best effort: what stays behind is
// never named by a manifest, so no reader finds it).
func Unpublish(ctx context.Context, cfg *Config, manifest, claim string, outs []Output) {
	named := map[string]bool{}
	m, err := ReadManifest(ctx, cfg.Out, manifest)
	switch {
	case err == nil:
		named[m.Claim.Name] = true
		for _, o := range m.Outputs {
			named[o.Name] = true
		}
		for _, p := range m.Pickles {
			named[p.Name] = true
		}
	case !errors.Is(err, store.ErrNotFound):
		return // what it names cannot be told: nothing is removed
	}
	keys := []string{claim}
	for _, o := range outs {
		keys = append(keys, o.Key)
	}
	for _, k := range keys {
		if path.Dir(k) == path.Dir(manifest) && !named[path.Base(k)] {
			cfg.Out.Delete(ctx, k)
		}
	}
}

// RemoveSuperseded removes, once this merge published under its attempt's names,
// what the attempt it superseded (a leader that died or stalled while publishing)
// stored under the window's own names: its claim and the outputs the claim names.
// A stalled writer that stores more later removes it itself when it finds the
// window published (Unpublish).
func RemoveSuperseded(ctx context.Context, cfg *Config, plain, mine map[string]string) {
	prev, err := ReadClaim(ctx, cfg.Out, plain[OutInputs])
	if err != nil || prev.Attempt == cfg.Attempt {
		return
	}
	ours := map[string]bool{}
	for _, k := range mine {
		ours[k] = true
	}
	dir := path.Dir(plain[OutInputs])
	for _, name := range prev.Outputs {
		k := path.Join(dir, name)
		if path.Base(k) == name && !ours[k] && !strings.ContainsAny(name, "/\\") && k != plain[OutManifest] {
			cfg.Out.Delete(ctx, k)
		}
	}
	cfg.Out.Delete(ctx, plain[OutInputs])
	cfg.Logger.Info("removed what a superseded attempt stored", "attempt", prev.Attempt)
}

// WriteClaim writes the claim (the inputs, the options and the outputs' names)
// into tmp; it returns its path and SHA-256.
func WriteClaim(cfg *Config, tmp string, refs []InputRef, sum *analysis.Summary, outs []Output) (string, string, error) {
	claim := Claim{Version: 1, Inputs: refs, WorldSize: sum.WorldSize, Align: cfg.Align, Title: cfg.Title, Outputs: map[string]string{}, Window: cfg.Window,
		Attempt: cfg.Attempt, MissingReasons: sum.MissingReasons}
	for _, o := range outs {
		claim.Outputs[o.Kind] = path.Base(o.Key)
	}
	if len(cfg.Offsets) > 0 {
		claim.Offsets = map[string]int64{}
		for r, o := range cfg.Offsets {
			claim.Offsets[strconv.Itoa(r)] = o
		}
	}
	cb, _ := json.MarshalIndent(claim, "", "  ")
	cb = append(cb, '\n')
	cpath := filepath.Join(tmp, OutInputs)
	if err := os.WriteFile(cpath, cb, 0o644); err != nil {
		return "", "", fmt.Errorf("merge: %w", err)
	}
	return cpath, digest.SHA256Hex(cb), nil
}

// StoreClaim stores the claim WriteClaim wrote.
func StoreClaim(ctx context.Context, cfg *Config, keys map[string]string, cpath, csum string) (Object, error) {
	if err := cfg.fence(ctx); err != nil {
		return Object{}, err
	}
	cobj, err := putOnce(ctx, cfg, keys[OutInputs], cpath, csum, OutInputs)
	if errors.Is(err, store.ErrExists) {
		return Object{}, fmt.Errorf("merge: %s in %s names other inputs or options: another merge claimed these names (pass overwrite to replace it): %w", keys[OutInputs], cfg.Out, err)
	}
	if err != nil {
		return Object{}, fmt.Errorf("merge: storing %s: %w", keys[OutInputs], err)
	}
	return cobj, nil
}

// ManifestOf is the manifest of a merge whose claim is stored as cobj: what
// it merged and found, with no output named yet.
func ManifestOf(cfg *Config, cobj Object, refs []InputRef, sum *analysis.Summary) Manifest {
	man := Manifest{Version: 1, Claim: cobj, Outputs: map[string]Object{}, Inputs: refs, Window: cfg.Window, WorldSize: sum.WorldSize,
		RanksMerged: sum.RanksMerged, MissingRanks: sum.MissingRanks, MissingReasons: sum.MissingReasons, ClockOffsetsUS: sum.ClockOffsetsUS, Align: sum.Align,
		Reason: cfg.Reason, Kind: cfg.Kind, Attempt: cfg.Attempt}
	if man.RanksMerged == nil {
		man.RanksMerged = []int{}
	}
	if sum.Spread != nil && len(sum.Ranks) > 1 && len(sum.Spread.OutlierRanks) > 0 {
		o := sum.Spread.OutlierRank // (the lowest of tied ones)
		man.OutlierRank = &o
	}
	man.Batches = commonBatches(sum.Ranks)
	man.Findings = sum.ManifestFindings()
	man.PartialRanks, man.Findings = partialRanks(cfg.Partial, sum.RanksMerged, man.Findings)
	return man
}

// maxPartialReason bounds what a manifest says of one partial rank.
const maxPartialReason = 4096

// partialRanks names the merged ranks that recorded part of the window, for the
// manifest, and says so first among the findings.
func partialRanks(partial map[int]string, merged []int, findings []string) (map[string]string, []string) {
	out := map[string]string{}
	var ranks []string
	for _, r := range merged {
		if why, ok := partial[r]; ok {
			out[strconv.Itoa(r)] = analysis.CutUTF8(why, maxPartialReason)
			ranks = append(ranks, strconv.Itoa(r))
		}
	}
	if len(out) == 0 {
		return nil, findings
	}
	line := fmt.Sprintf("ranks %s recorded part of the window (partial_ranks says what each covers)", strings.Join(ranks, ", "))
	if len(ranks) == 1 {
		line = fmt.Sprintf("rank %s recorded part of the window: %s", ranks[0], out[ranks[0]])
	}
	findings = append([]string{analysis.CutUTF8(line, analysis.MaxFindingBytes)}, findings...)
	if len(findings) > analysis.MaxManifestFindings {
		findings = findings[:analysis.MaxManifestFindings]
	}
	return out, findings
}

// commonBatches returns the batches every merged rank recorded (from the
// sidecars' batch marks), or nil when no rank has marks.
func commonBatches(ranks []analysis.RankSummary) []int64 {
	var out []int64
	for i, r := range ranks {
		if i == 0 {
			out = append([]int64(nil), r.Batches...)
			continue
		}
		if !bytes.Equal(int64sKey(out), int64sKey(r.Batches)) {
			return nil
		}
	}
	return out
}

func int64sKey(v []int64) []byte {
	b := make([]byte, 0, len(v)*8)
	for _, x := range v {
		b = strconv.AppendInt(b, x, 10)
		b = append(b, ',')
	}
	return b
}

// CutReason bounds a reason kept in a manifest.
func CutReason(s string) string { return cutReasonN(s, analysis.MaxFindingBytes) }

func cutReasonN(s string, n int) string {
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "")
	}
	return s
}
