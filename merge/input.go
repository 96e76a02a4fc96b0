package merge

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/memsnap/memsnap/internal/digest"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/naming"
)

// Layouts are the per-rank snapshot names memsnap recognises out of the box.
var Layouts = map[string]string{
	"composer":   naming.ComposerSnapshotName,
	"torchtitan": naming.TorchtitanSnapshotName,
	"megatron":   "{run_name}_{rank}.pickle",
}

// Input is one rank's snapshot, wherever it lives.
type Input struct {
	Rank   int    // -1 for a merged .memsnap.pb, which holds several ranks
	Source string // a path or s3:// URL, for messages
	load   func(ctx context.Context) ([]byte, error)
	meta   func(ctx context.Context) ([]byte, error) // nil, or the sidecar's bytes (nil, nil when absent)
	// analysis is nil, or reads the rank's analysis (nil, nil when absent)
	analysis func(ctx context.Context) ([]byte, error)
	pre      *preloaded // Preload's: what was read and parsed already
}

// preloaded is an input's sidecar and analysis, read and parsed ahead of its
// merge (Preload); a field is nil when it was not read or does not parse, and
// the merge then reads it as usual.
type preloaded struct {
	meta    *sidecar.RankMeta
	metaSHA string
	a       *analysis.RankAnalysis
}

// Preload reads in's sidecar and analysis now, and parses them: a merge then takes
// them from memory, without reading or parsing them again (a leader preloads each
// rank's while the other ranks still upload). What cannot be read or parsed now
// is left to the merge, which reads it again and says what is wrong. The merge
// only reads what it takes, so one preloaded input serves several merges.
func Preload(ctx context.Context, in Input) Input {
	p := &preloaded{}
	if in.meta != nil {
		if raw, err := in.meta(ctx); err == nil && raw != nil {
			if m, err := sidecar.ParseRankMeta(raw); err == nil {
				p.meta, p.metaSHA = m, digest.SHA256Hex(raw)
				in.meta = func(context.Context) ([]byte, error) { return raw, nil }
			}
		}
	}
	if in.analysis != nil {
		if raw, err := in.analysis(ctx); err == nil && raw != nil {
			if a, err := analysis.ParseAnalysis(raw); err == nil {
				p.a = a
			}
		}
	}
	in.pre = p
	return in
}

// Meta is the sidecar Preload read and parsed, or nil.
func (in Input) Meta() *sidecar.RankMeta {
	if in.pre == nil {
		return nil
	}
	return in.pre.meta
}

// WithAnalysis returns in with a loader of its rank's analysis (the bytes of the
// file AnalysisName names, as Analyze and RankAnalysis.Marshal wrote it; nil and
// no error when there is none). Merge uses it under Config.FromAnalyses.
func (in Input) WithAnalysis(load func(ctx context.Context) ([]byte, error)) Input {
	in.analysis = load
	return in
}

// WithMeta returns in with its sidecar's bytes read already (by a caller that
// checked them): the merge takes them instead of reading the sidecar again.
func (in Input) WithMeta(raw []byte) Input {
	in.meta = func(context.Context) ([]byte, error) { return raw, nil }
	return in
}

// StoreAnalysis is an analysis loader for the object at key in st: nil when it does
// not exist, an error when it is larger than MaxAnalysisBytes.
func StoreAnalysis(st store.Store, key string) func(ctx context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		b, _, err := store.ReadObject(ctx, st, key, analysis.MaxAnalysisBytes)
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		return b, err
	}
}

// fileAnalysis is an analysis loader for a local file: nil when it does not exist.
func fileAnalysis(p string) func(ctx context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		st, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if st.Size() > analysis.MaxAnalysisBytes {
			return nil, fmt.Errorf("merge: %s is larger than %d bytes", p, analysis.MaxAnalysisBytes)
		}
		return snapshot.ReadFileBytes(ctx, p)
	}
}

// Resolver turns command-line inputs into Inputs.
type Resolver struct {
	// Template recovers a rank from a snapshot's file name.
	Template *naming.Template
	// OpenStore opens the bucket of an s3:// input.
	OpenStore func(ctx context.Context, bucketURL string) (store.Store, error)
}

func isPB(name string) bool { return strings.HasSuffix(name, ".memsnap.pb") }

func snapshotName(name string) string {
	return strings.TrimSuffix(strings.TrimSuffix(name, ".gz"), ".zst")
}

// Resolve expands files, folders, globs and s3:// prefixes, and explicit
// RANK=PATH pairs, into one Input per rank. Two inputs for one rank is an error.
func (r *Resolver) Resolve(ctx context.Context, args []string, explicit []string) ([]Input, error) {
	var out []Input
	for _, a := range args {
		ins, err := r.expand(ctx, a, -1)
		if err != nil {
			return nil, err
		}
		out = append(out, ins...)
	}
	for _, kv := range explicit {
		rs, p, ok := strings.Cut(kv, "=")
		rank, err := strconv.Atoi(rs)
		if !ok || err != nil || rank < 0 {
			return nil, fmt.Errorf("merge: --rank %q: want RANK=PATH with RANK >= 0", kv)
		}
		ins, err := r.expand(ctx, p, rank)
		if err != nil {
			return nil, err
		}
		if len(ins) != 1 {
			return nil, fmt.Errorf("merge: --rank %q names %d files, want one", kv, len(ins))
		}
		out = append(out, ins...)
	}
	if len(out) == 0 {
		return nil, errors.New("merge: no inputs")
	}
	seen := map[int]string{}
	for _, in := range out {
		if in.Rank < 0 {
			continue
		}
		if prev, ok := seen[in.Rank]; ok {
			return nil, fmt.Errorf("merge: rank %d is claimed by both %s and %s", in.Rank, prev, in.Source)
		}
		seen[in.Rank] = in.Source
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out, nil
}

// rankOf recovers the rank from a base name.
func (r *Resolver) rankOf(name string) (int, bool) {
	v, ok := r.Template.Match(snapshotName(name))
	if !ok {
		return 0, false
	}
	n, ok := v["rank"].(int64)
	return int(n), ok && n >= 0
}

func (r *Resolver) expand(ctx context.Context, arg string, rank int) ([]Input, error) {
	if naming.IsS3(arg) {
		return r.expandS3(ctx, arg, rank)
	}
	st, err := os.Stat(arg)
	switch {
	case err == nil && st.IsDir():
		if rank >= 0 {
			return nil, fmt.Errorf("merge: %s is a folder; --rank takes one file", arg)
		}
		ents, err := os.ReadDir(arg)
		if err != nil {
			return nil, fmt.Errorf("merge: %w", err)
		}
		var out []Input
		for _, e := range ents {
			if e.IsDir() {
				continue
			}
			if in, ok := r.fileInput(filepath.Join(arg, e.Name()), -1, false); ok {
				out = append(out, in)
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("merge: no snapshot in %s is named like %q (choose a --layout or --name-template)", arg, r.Template)
		}
		return preferRanks(out), nil
	case err == nil:
		in, ok := r.fileInput(arg, rank, true)
		if !ok {
			return nil, fmt.Errorf("merge: cannot tell the rank of %s from its name with template %q; pass --rank N=%s, a --layout or a --name-template", arg, r.Template, arg)
		}
		return []Input{in}, nil
	case errors.Is(err, fs.ErrNotExist) && strings.ContainsAny(arg, "*?["):
		matches, gerr := filepath.Glob(arg)
		if gerr != nil {
			return nil, fmt.Errorf("merge: glob %q: %w", arg, gerr)
		}
		var out []Input
		for _, m := range matches {
			if in, ok := r.fileInput(m, -1, false); ok {
				out = append(out, in)
			}
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("merge: %q matches no snapshot named like %q", arg, r.Template)
		}
		if rank >= 0 && len(out) == 1 {
			out[0].Rank = rank
		}
		return preferRanks(out), nil
	default:
		return nil, fmt.Errorf("merge: %w", err)
	}
}

func (r *Resolver) fileInput(p string, rank int, explicit bool) (Input, bool) {
	base := filepath.Base(p)
	if isPB(base) {
		return Input{Rank: -1, Source: p, load: func(ctx context.Context) ([]byte, error) { return snapshot.ReadFileBytes(ctx, p) }}, true
	}
	if rank < 0 {
		var ok bool
		if rank, ok = r.rankOf(base); !ok {
			return Input{}, false
		}
	} else if !explicit && !strings.Contains(base, ".pickle") {
		return Input{}, false
	}
	metaPath := filepath.Join(filepath.Dir(p), sidecar.MetaName(base))
	return Input{
		Rank: rank, Source: p, analysis: fileAnalysis(filepath.Join(filepath.Dir(p), analysis.AnalysisName(base))),
		load: func(ctx context.Context) ([]byte, error) { return snapshot.ReadFileBytes(ctx, p) },
		meta: func(ctx context.Context) ([]byte, error) {
			b, err := snapshot.ReadFileBytes(ctx, metaPath)
			if errors.Is(err, fs.ErrNotExist) {
				return nil, nil
			}
			return b, err
		},
	}, true
}

func (r *Resolver) expandS3(ctx context.Context, arg string, rank int) ([]Input, error) {
	u, err := naming.ParseS3(arg)
	if err != nil {
		return nil, err
	}
	if r.OpenStore == nil {
		return nil, fmt.Errorf("merge: %s: no object store configured", arg)
	}
	st, err := r.OpenStore(ctx, "s3://"+u.Bucket)
	if err != nil {
		return nil, err
	}
	objs, err := st.List(ctx, u.Key)
	if err != nil {
		return nil, err
	}
	keys := map[string]bool{}
	for _, o := range objs {
		keys[o.Key] = true
	}
	mk := func(key string, rank int) Input {
		metaKey := path.Join(path.Dir(key), sidecar.MetaName(path.Base(key)))
		in := Input{Rank: rank, Source: "s3://" + u.Bucket + "/" + key,
			load: func(ctx context.Context) ([]byte, error) { return store.ReadAll(ctx, st, key) }}
		if keys[metaKey] {
			in.meta = func(ctx context.Context) ([]byte, error) { return readMeta(ctx, st, metaKey) }
		}
		if ak := path.Join(path.Dir(key), analysis.AnalysisName(path.Base(key))); keys[ak] {
			in.analysis = StoreAnalysis(st, ak)
		}
		return in
	}
	if keys[u.Key] { // one object
		base := path.Base(u.Key)
		if isPB(base) {
			return []Input{mk(u.Key, -1)}, nil
		}
		if rank < 0 {
			var ok bool
			if rank, ok = r.rankOf(base); !ok {
				return nil, fmt.Errorf("merge: cannot tell the rank of %s from its name with template %q", arg, r.Template)
			}
		}
		return []Input{mk(u.Key, rank)}, nil
	}
	var out []Input
	for _, o := range objs {
		base := path.Base(o.Key)
		if isPB(base) {
			out = append(out, mk(o.Key, -1))
			continue
		}
		if rk, ok := r.rankOf(base); ok {
			out = append(out, mk(o.Key, rk))
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("merge: nothing under %s is named like %q", arg, r.Template)
	}
	return preferRanks(out), nil
}

// preferRanks drops merged .memsnap.pb files from an expansion that also found
// per-rank snapshots (a folder holding both its inputs and an earlier merge).
func preferRanks(ins []Input) []Input {
	var ranks []Input
	for _, in := range ins {
		if in.Rank >= 0 {
			ranks = append(ranks, in)
		}
	}
	if len(ranks) > 0 {
		return ranks
	}
	return ins
}

// StoreInput is rank's snapshot stored at key in st, with its sidecar at metaKey
// ("" when there is none). Its source is the key, as the claim records it.
func StoreInput(st store.Store, key, metaKey string, rank int) Input {
	in := Input{Rank: rank, Source: key, load: func(ctx context.Context) ([]byte, error) { return store.ReadAll(ctx, st, key) }}
	if metaKey != "" {
		in.meta = func(ctx context.Context) ([]byte, error) {
			b, err := readMeta(ctx, st, metaKey)
			if errors.Is(err, store.ErrNotFound) {
				return nil, nil
			}
			return b, err
		}
	}
	return in
}

// readMeta reads the sidecar at key in st, refusing one larger than
// sidecar.MaxMetaBytes.
func readMeta(ctx context.Context, st store.Store, key string) ([]byte, error) {
	b, _, err := store.ReadObject(ctx, st, key, sidecar.MaxMetaBytes)
	return b, err
}
