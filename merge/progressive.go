package merge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/memsnap/memsnap/internal/retry"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/merge/render"
	"github.com/memsnap/memsnap/merge/sidecar"
)

// Answer is the first step of a progressive merge, once it is published: the
// manifest names the summary, the report and the trace, and says (Pending) that
// the merged pickles and the timeline are still being written.
type Answer struct {
	Manifest string // the manifest's key
	M        *publish.Manifest
	Summary  *analysis.Summary
}

// ErrOtherInputs: a progressive merge found the window's answer published from
// other snapshots than its own inputs, so it cannot write the answer's pickles.
var ErrOtherInputs = errors.New("merge: the published answer was merged from other snapshots")

// readAnswer reads the window's answer when a progressive merge published it with
// outputs pending; the merge then writes that answer's outputs, from its ranks
// (cfg's Ranks and Window become the answer's). No answer is nil; a finished or
// failed window, or an answer this merge cannot complete, is an error.
func readAnswer(ctx context.Context, cfg *Config, keys map[string]string) (*publish.Manifest, error) {
	m, err := publish.ReadManifest(ctx, cfg.Out, keys[publish.OutManifest])
	switch {
	case err == nil && m.Failed():
		return nil, fmt.Errorf("merge: %s in %s commits the window as failed (%s): %w", keys[publish.OutManifest], cfg.Out, m.Error, store.ErrExists)
	case err == nil && len(m.Pending) == 0:
		return nil, fmt.Errorf("merge: %s exists in %s: this merge was published already: %w", keys[publish.OutManifest], cfg.Out, store.ErrExists)
	case err == nil && !strings.HasSuffix(m.Claim.Name, publish.OutSuffix[publish.OutInputs]):
		return nil, fmt.Errorf("%w: %s waits for outputs but names no claim (%q) to name them after", ErrOtherInputs, keys[publish.OutManifest], m.Claim.Name)
	case err == nil:
		cfg.Ranks = rankSetOf(m.RanksMerged) // the answer's ranks, and no others
		if cfg.Window == nil {
			cfg.Window = m.Window
		}
		return m, nil
	case !errors.Is(err, store.ErrNotFound):
		return nil, err
	}
	return nil, nil
}

// mergeProgressive publishes a merge in two steps, each with its manifest as its
// commit point:
//
//  1. the answer: the claim, the trace, the summary and the report, then the
//     manifest (created once, as a plain merge's), whose Pending names the
//     outputs still to come; OnAnswer is called once it is stored;
//  2. the detail: each rank decoded again, the merged pickles and the timeline,
//     then the manifest again, now naming them, with nothing pending.
//
// The second step's names follow the answer's claim, whoever writes them: a
// merge that finds the window's answer published with outputs pending (its
// leader died or stalled between the steps, or the store failed in the second)
// writes the second step itself, from the ranks the answer merged, which must be
// the same snapshots. Its outputs depend only on them and the claim's options, so
// every merge that writes the second step writes the same bytes under the same
// names, and the same final manifest: two of them at once (a leader woken from a
// stall and its successor) cannot mix sets or leave anything behind. The
// answer's outputs are never written again.
func (b *builder) mergeProgressive(ctx context.Context, answered *publish.Manifest) (*Result, error) {
	cfg, keys := b.cfg, b.keys
	world, err := b.world()
	if err != nil {
		return nil, err
	}
	sum := b.summary(world)
	if answered == nil {
		if answered, err = b.publishAnswer(ctx, keys, sum); err != nil {
			return nil, err
		}
		b.removeSuperseded(ctx)
		cfg.Logger.Info("answer published", "manifest", keys[publish.OutManifest], "ranks", len(sum.Ranks), "elapsed", time.Since(b.start).Round(time.Millisecond))
	} else {
		if err := sameInputs(b.refs, answered.Inputs); err != nil {
			return nil, fmt.Errorf("%w: %s (%v)", ErrOtherInputs, keys[publish.OutManifest], err)
		}
		sum.MissingRanks, sum.MissingReasons = answered.MissingRanks, answered.MissingReasons
		cfg.Logger.Info("the window's answer is published with outputs pending; writing them", "manifest", keys[publish.OutManifest], "answered_by", answered.Attempt)
	}
	if cfg.OnAnswer != nil {
		cfg.OnAnswer(Answer{Manifest: keys[publish.OutManifest], M: answered, Summary: sum})
	}
	final, err := b.publishDetail(ctx, keys, world, answered)
	if err != nil {
		return nil, err
	}
	b.logDone(sum)
	dir := path.Dir(keys[publish.OutManifest])
	res := &Result{Summary: sum, Manifest: final, Outputs: map[string]string{publish.OutInputs: path.Join(dir, final.Claim.Name), publish.OutManifest: keys[publish.OutManifest]},
		Decoded: b.decoded, FromAnalyses: b.fromAnalyses}
	for kind, o := range final.Outputs {
		res.Outputs[kind] = path.Join(dir, o.Name)
	}
	return res, nil
}

// pendingOutputs are what the answer's manifest says is still to come.
var pendingOutputs = []string{publish.OutPickle, publish.OutPB}

// publishAnswer stores the claim, the trace, the summary and the report, then the
// manifest that says the pickles and the timeline are coming.
func (b *builder) publishAnswer(ctx context.Context, keys map[string]string, sum *analysis.Summary) (*publish.Manifest, error) {
	cfg := b.cfg
	// the report is written beside the trace and the summary: at 1,024 ranks
	// each is tens of milliseconds on the answer's way (the report reads the
	// summary, which gets its outputs only once the report is written)
	html := make(chan error, 1)
	go func() { html <- render.WriteHTML(b.files[publish.OutHTML], cfg.Title, sum, b.ranks) }()
	sb, err := b.finishTrace(sum, keys)
	if herr := <-html; herr != nil {
		return nil, fmt.Errorf("merge: writing the report: %w", herr)
	}
	if err != nil {
		return nil, err
	}
	// the summary names the outputs whose names are known now; the manifest
	// names the pickles (split by size, their names are known once written)
	sum.Outputs = outputsOf(keys)
	if _, err := b.files[publish.OutSummary].Write(append(sb, '\n')); err != nil {
		return nil, err
	}
	var outs []publish.Output
	for _, k := range []string{publish.OutTrace, publish.OutSummary, publish.OutHTML} {
		if err := b.files[k].F.Close(); err != nil {
			return nil, fmt.Errorf("merge: writing %s: %w", k, err)
		}
		outs = append(outs, publish.Output{Kind: k, Key: keys[k], File: filepath.Join(b.tmp, k), Sum: b.files[k].Sum()})
	}
	// the claim names every output of both steps (the pickles by their plain
	// name: parts are named in the second step's intent)
	named := append([]publish.Output{{Kind: publish.OutPickle, Key: keys[publish.OutPickle]}, {Kind: publish.OutPB, Key: keys[publish.OutPB]}}, outs...)
	cpath, csum, err := publish.WriteClaim(cfg.publishing(), b.tmp, b.refs, sum, named)
	if err != nil {
		return nil, err
	}
	cobj, err := publish.StoreClaim(ctx, cfg.publishing(), keys, cpath, csum)
	if err != nil {
		return nil, err
	}
	man := publish.ManifestOf(cfg.publishing(), cobj, b.refs, sum)
	if err := publish.StoreOutputs(ctx, cfg.publishing(), &man, outs); err != nil {
		return nil, err
	}
	man.Pending = pendingOutputs
	if err := publish.PutManifest(ctx, cfg.publishing(), keys[publish.OutManifest], &man, ""); err != nil {
		if errors.Is(err, store.ErrExists) {
			publish.Unpublish(ctx, cfg.publishing(), keys[publish.OutManifest], keys[publish.OutInputs], outs)
			return nil, fmt.Errorf("merge: %s was published by another merge first: %w", keys[publish.OutManifest], err)
		}
		if errors.Is(err, publish.ErrFenced) {
			publish.Unpublish(ctx, cfg.publishing(), keys[publish.OutManifest], keys[publish.OutInputs], outs)
		}
		return nil, err
	}
	return &man, nil
}

// finishTrace finishes the trace and encodes the summary as it is published,
// with the outputs known now (sum itself is left as it is: the report reads it
// meanwhile).
func (b *builder) finishTrace(sum *analysis.Summary, keys map[string]string) ([]byte, error) {
	if err := b.tw.Finish(); err != nil {
		return nil, fmt.Errorf("merge: writing the trace: %w", err)
	}
	s := *sum
	s.Outputs = outputsOf(keys)
	return json.MarshalIndent(&s, "", "  ")
}

// outputsOf are the outputs a summary names: those whose names are known
// before the pickles are written.
func outputsOf(keys map[string]string) map[string]string {
	out := make(map[string]string, len(fixedOutputs))
	for _, k := range fixedOutputs {
		out[k] = keys[k]
	}
	return out
}

// publishDetail decodes the ranks again, writes the pickles and the timeline,
// stores them under the answer's names and publishes the manifest that names
// them. When another merge completed the window first (with the same bytes), it
// says so (store.ErrExists).
func (b *builder) publishDetail(ctx context.Context, keys map[string]string, world int, answered *publish.Manifest) (*publish.Manifest, error) {
	cfg := b.cfg
	ranks := b.diffRanks()
	if cfg.Detail == DetailAll {
		ranks = ranks[:0]
		for _, e := range b.ranks {
			ranks = append(ranks, e.Summary.Rank)
		}
	}
	lacking, err := b.decodeRanks(ctx, ranks)
	if err != nil {
		return nil, err
	}
	if err := b.pickles.Finish(world); err != nil {
		return nil, err
	}
	b.pbWait()
	b.pbw.Header(cfg.Align, world, answered.MissingRanks)
	if err := b.pbw.Finish(); err != nil {
		return nil, fmt.Errorf("merge: writing the timeline: %w", err)
	}
	if err := b.files[publish.OutPB].F.Close(); err != nil {
		return nil, fmt.Errorf("merge: writing %s: %w", publish.OutPB, err)
	}
	// the answer's names: base is where its claim lies, <base>.inputs.json
	base := path.Join(path.Dir(keys[publish.OutManifest]), strings.TrimSuffix(answered.Claim.Name, publish.OutSuffix[publish.OutInputs]))
	outs := b.pickles.Outputs(base+publish.OutSuffix[publish.OutPickle], base, cfg.PicklePartName)
	outs = append(outs, publish.Output{Kind: publish.OutPB, Key: base + publish.OutSuffix[publish.OutPB], File: filepath.Join(b.tmp, publish.OutPB), Sum: b.files[publish.OutPB].Sum()})
	man := *answered
	man.Outputs = map[string]publish.Object{}
	for k, o := range answered.Outputs {
		man.Outputs[k] = o
	}
	man.Pickles, man.Pending, man.DetailMissing = nil, nil, lacking
	if err := publish.StoreOutputs(ctx, cfg.publishing(), &man, outs); errors.Is(err, store.ErrExists) {
		return nil, fmt.Errorf("%w: other bytes than this merge wrote are stored under the answer's names (a leader with other options completed the window?): %v", ErrOtherInputs, err)
	} else if err != nil {
		return nil, err
	}
	// the manifest is replaced only while it is still the answer it was read as
	// (If-Match): a merge completing it at the same time writes the same bytes,
	// and one with other settings cannot orphan the pickles this one names
	cur, tag, err := publish.ReadManifestVersion(ctx, cfg.Out, keys[publish.OutManifest])
	if err != nil {
		return nil, err
	}
	if len(cur.Pending) == 0 || cur.Claim != answered.Claim || tag == "" {
		return nil, fmt.Errorf("merge: %s was completed by another merge first: %w", keys[publish.OutManifest], store.ErrExists)
	}
	if err := publish.PutManifest(ctx, cfg.publishing(), keys[publish.OutManifest], &man, tag); errors.Is(err, store.ErrChanged) {
		return nil, fmt.Errorf("merge: %s was completed by another merge first: %w", keys[publish.OutManifest], store.ErrExists)
	} else if err != nil {
		return nil, err
	}
	cfg.Logger.Info("published", "manifest", keys[publish.OutManifest], "store", cfg.Out.String())
	return &man, nil
}

// sameInputs checks that a merge read the snapshots an answer was merged from.
func sameInputs(got, want []publish.InputRef) error {
	key := func(r publish.InputRef) string {
		return fmt.Sprintf("%d %s %s %s", r.Rank, r.Source, r.SHA256, r.MetaSHA256)
	}
	g, w := make([]string, len(got)), make([]string, len(want))
	for i, r := range got {
		g[i] = key(r)
	}
	for i, r := range want {
		w[i] = key(r)
	}
	sort.Strings(g)
	sort.Strings(w)
	if strings.Join(g, "\n") != strings.Join(w, "\n") {
		return fmt.Errorf("%d inputs read, %d in the answer, not the same", len(got), len(want))
	}
	return nil
}

// rankSetOf is the set of the given ranks.
func rankSetOf(ranks []int) *RankSet {
	s := &RankSet{}
	rs := append([]int(nil), ranks...)
	sort.Ints(rs)
	for _, r := range rs {
		if n := len(s.spans); n > 0 && s.spans[n-1][1] >= r-1 {
			s.spans[n-1][1] = max(s.spans[n-1][1], r)
			continue
		}
		s.spans = append(s.spans, [2]int{r, r})
	}
	return s
}

// decodeRanks decodes the given ranks again (Workers ahead, in parallel) and
// writes each one's full trace into the pickles and the timeline, in rank order.
// A rank whose snapshot cannot be decoded as its analysis describes it (the
// answer is published already, from the analyses) is left out of them with the
// reason, returned by rank; a store that fails to read one is an error.
func (b *builder) decodeRanks(ctx context.Context, ranks []int) (map[string]string, error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	var lacking map[string]string
	type decoded struct {
		rd  *analysis.RankData
		err error
	}
	results := make([]chan decoded, len(ranks))
	for i := range results {
		results[i] = make(chan decoded, 1)
	}
	sem := make(chan struct{}, b.cfg.Workers)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i, r := range ranks {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				rd, err := b.decodeAgain(ctx, r)
				results[i] <- decoded{rd, err}
			}()
		}
	}()
	for i, r := range ranks {
		var d decoded
		select {
		case d = <-results[i]:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		<-sem
		if d.err != nil {
			in := b.inputs[b.inputOf[r]]
			if ctx.Err() != nil || transientRead(d.err) {
				return nil, &InputError{Rank: in.Rank, Source: in.Source, Err: d.err}
			}
			b.cfg.Logger.Warn("a rank's snapshot cannot be decoded; the pickles and the timeline leave it out", "of_rank", r, "source", in.Source, "err", d.err)
			if lacking == nil {
				lacking = map[string]string{}
			}
			lacking[strconv.Itoa(r)] = publish.CutReason(d.err.Error())
			continue
		}
		b.decoded = append(b.decoded, r)
		if err := b.addDetail(d.rd); err != nil {
			return nil, err
		}
	}
	return lacking, nil
}

// transientRead reports whether reading an input failed in a way that may go
// away by itself (the store is unreachable, a connection broke), as opposed to
// an input that is not what it should be.
func transientRead(err error) bool {
	return retry.Transient(err) || errors.Is(err, context.Canceled)
}

// AnswerInputs are the inputs a published answer was merged from, read from st
// by the names its manifest records (each snapshot's key, with its sidecar and
// its analysis beside it): what a merge that completes the answer reads.
func AnswerInputs(st store.Store, m *publish.Manifest) []Input {
	var ins []Input
	for _, ref := range m.Inputs {
		if ref.Rank < 0 || isPB(ref.Source) {
			continue // (a cluster's answer is merged from snapshots)
		}
		ins = append(ins, StoreInput(st, ref.Source, sidecar.MetaName(ref.Source), ref.Rank).WithAnalysis(StoreAnalysis(st, analysis.AnalysisName(ref.Source))))
	}
	return ins
}
