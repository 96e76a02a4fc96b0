package analysis

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// RankDiff compares what two ranks (or two windows of one rank) held alive at
// their peaks, site by site: why Other differs from Base.
type RankDiff struct {
	Base  DiffSide `json:"base"`
	Other DiffSide `json:"other"`
	// PeakDeltaBytes is Other's peak less Base's.
	PeakDeltaBytes int64 `json:"peak_delta_bytes"`
	// Sites are every site either side names at its peak, the largest difference
	// first; bytes allocated before recording began count as one more site,
	// BeforeRecordingSite. The deltas add up to PeakDeltaBytes when both sides
	// name all their sites.
	Sites []SiteDiff `json:"sites"`
	// Categories compares what each peak held by category (parameters,
	// gradients, ...), the largest difference first, each with the module whose
	// bytes of that category differ most; empty when a side has no categories.
	Categories []CategoryDiff `json:"categories,omitempty"`
}

// CategoryDiff is one category's bytes at each side's peak.
type CategoryDiff struct {
	Category   string `json:"category"`
	BaseBytes  int64  `json:"base_bytes"`
	OtherBytes int64  `json:"other_bytes"`
	DeltaBytes int64  `json:"delta_bytes"`
	// Module is the module whose bytes of this category differ most (among the
	// modules each side names), with its difference.
	Module           string `json:"module,omitempty"`
	ModuleDeltaBytes int64  `json:"module_delta_bytes,omitempty"`
}

// DiffSide is one side of a diff: which rank, and its peak.
type DiffSide struct {
	Label              string `json:"label"` // "rank 3", or a file's name
	Rank               int    `json:"rank"`
	Source             string `json:"source,omitempty"`
	PeakAllocatedBytes int64  `json:"peak_allocated_bytes"`
	PeakTimeUS         int64  `json:"peak_allocated_time_us"`
	PeakBatch          *int64 `json:"peak_allocated_batch"`
	PeakPhase          string `json:"peak_phase,omitempty"`
	// Complete is false when the side's analysis names only its largest sites:
	// a site absent from it may still be among the rest.
	Complete bool `json:"complete"`
	// OutsideAllocatorBytes is device memory in use beyond the allocator's
	// reserved bytes at the reserved peak (NVML; nil without samples).
	OutsideAllocatorBytes *int64 `json:"outside_allocator_bytes,omitempty"`
	// Truncated says the side's history lost its oldest events (its peak may be
	// among them); LeakPerBatchBytes is its growth per batch when it leaks.
	Truncated         bool  `json:"truncated,omitempty"`
	LeakPerBatchBytes int64 `json:"leak_per_batch_bytes,omitempty"`
}

// SiteDiff is one site's bytes at each side's peak.
type SiteDiff struct {
	Site        string `json:"site"`
	BaseBytes   int64  `json:"base_bytes"`
	OtherBytes  int64  `json:"other_bytes"`
	DeltaBytes  int64  `json:"delta_bytes"`
	BaseBlocks  int    `json:"base_blocks"`
	OtherBlocks int    `json:"other_blocks"`
	// Only is "base" or "other" when that side alone holds the site.
	Only string `json:"only,omitempty"`
}

// BeforeRecordingSite names the bytes alive at a peak that were allocated before
// recording began (no stack was recorded for them).
const BeforeRecordingSite = "(allocated before recording began)"

// pseudoSite reports whether a diff's row stands for no one site.
func pseudoSite(name string) bool { return name == BeforeRecordingSite || name == otherSitesName }

// DiffInput is one side of Diff: an analysis and how to call it.
type DiffInput struct {
	Label  string
	Source string
	A      *RankAnalysis
	// ShiftUS is added to the analysis's times (its alignment in a merge).
	ShiftUS int64
}

// Diff compares other with base, site by site.
func Diff(base, other DiffInput) *RankDiff {
	d := &RankDiff{Base: diffSide(base), Other: diffSide(other), Sites: []SiteDiff{}}
	d.PeakDeltaBytes = d.Other.PeakAllocatedBytes - d.Base.PeakAllocatedBytes
	by := map[string]*SiteDiff{}
	row := func(name string) *SiteDiff {
		if by[name] == nil {
			by[name] = &SiteDiff{Site: name}
		}
		return by[name]
	}
	for _, s := range withEarly(base.A) {
		r := row(s.Site)
		r.BaseBytes, r.BaseBlocks = r.BaseBytes+s.Bytes, r.BaseBlocks+s.Blocks
	}
	for _, s := range withEarly(other.A) {
		r := row(s.Site)
		r.OtherBytes, r.OtherBlocks = r.OtherBytes+s.Bytes, r.OtherBlocks+s.Blocks
	}
	for _, r := range by {
		r.DeltaBytes = r.OtherBytes - r.BaseBytes
		switch {
		case pseudoSite(r.Site):
		case r.BaseBlocks == 0 && r.OtherBlocks > 0 && d.Base.Complete:
			r.Only = "other"
		case r.OtherBlocks == 0 && r.BaseBlocks > 0 && d.Other.Complete:
			r.Only = "base"
		}
		d.Sites = append(d.Sites, *r)
	}
	sort.Slice(d.Sites, func(i, j int) bool {
		ai, aj := absInt(d.Sites[i].DeltaBytes), absInt(d.Sites[j].DeltaBytes)
		if ai != aj {
			return ai > aj
		}
		return d.Sites[i].Site < d.Sites[j].Site
	})
	d.Categories = diffCategories(base.A.Categories, other.A.Categories)
	return d
}

// diffCategories compares two sides' categories at their peaks.
func diffCategories(b, o *Categories) []CategoryDiff {
	if b == nil || o == nil {
		return nil
	}
	// each side's modules at its peak, by category. A side names its largest
	// analysisModules only, so a module missing from a full list holds somewhere
	// between nothing and the least of that list's smallest entry and the side's
	// whole category: a difference is told only where it is certain, and by the
	// least it can be (a module pushed out by another's larger share is none)
	type key struct{ cat, mod string }
	type sideMods struct {
		bytes map[key]int64
		full  bool
		least int64 // the smallest entry of a full list
		at    map[string]int64
	}
	side := func(c *Categories) sideMods {
		s := sideMods{bytes: make(map[key]int64, len(c.Modules)), full: len(c.Modules) >= analysisModules, at: c.AtPeak}
		for i, x := range c.Modules {
			s.bytes[key{x.Category, x.Module}] += x.Bytes
			if i == 0 || x.Bytes < s.least {
				s.least = x.Bytes
			}
		}
		return s
	}
	bounds := func(s sideMods, k key) (lo, hi int64) {
		if v, ok := s.bytes[k]; ok || !s.full {
			return v, v
		}
		return 0, max(min(s.least, s.at[k.cat]), 0)
	}
	bs, os := side(b), side(o)
	mods := map[string]map[string]int64{} // category -> module -> other less base
	note := func(k key) {
		if mods[k.cat] == nil {
			mods[k.cat] = map[string]int64{}
		}
		bLo, bHi := bounds(bs, k)
		oLo, oHi := bounds(os, k)
		switch lo, hi := oLo-bHi, oHi-bLo; {
		case lo > 0:
			mods[k.cat][k.mod] = lo
		case hi < 0:
			mods[k.cat][k.mod] = hi
		default: // no difference is certain
			mods[k.cat][k.mod] = 0
		}
	}
	for k := range bs.bytes {
		note(k)
	}
	for k := range os.bytes {
		note(k)
	}
	var out []CategoryDiff
	for _, c := range CategoryNames {
		x := CategoryDiff{Category: c, BaseBytes: b.AtPeak[c], OtherBytes: o.AtPeak[c]}
		x.DeltaBytes = x.OtherBytes - x.BaseBytes
		if x.BaseBytes == 0 && x.OtherBytes == 0 {
			continue
		}
		for m, dl := range mods[c] {
			if dl != 0 && (absInt(dl) > absInt(x.ModuleDeltaBytes) || (absInt(dl) == absInt(x.ModuleDeltaBytes) && m < x.Module)) {
				x.Module, x.ModuleDeltaBytes = m, dl
			}
		}
		out = append(out, x)
	}
	sort.SliceStable(out, func(i, j int) bool { return absInt(out[i].DeltaBytes) > absInt(out[j].DeltaBytes) })
	return out
}

// CategoryHeadline says in one line which known category differs most between
// the two peaks (unknown only when no known one differs), and in which module
// ("rank 3 holds 96.0 MiB more activations, most in forward (model.py:10)"); ""
// when the sides have no categories or none differs.
func (d *RankDiff) CategoryHeadline() string {
	c, ok := d.headlineCategory()
	if !ok {
		return ""
	}
	more, n := "more", c.DeltaBytes
	if n < 0 {
		more, n = "less", -n
	}
	s := fmt.Sprintf("%s holds %s %s %s than %s", d.Other.Label, human(n), more, CategoryText(c.Category), d.Base.Label)
	if c.Module != "" && (c.ModuleDeltaBytes > 0) == (c.DeltaBytes > 0) {
		s += fmt.Sprintf(", %s of it in %s", human(absI64(c.ModuleDeltaBytes)), c.Module)
	}
	return s
}

// headlineCategory is the category CategoryHeadline names: the known category
// that differs most, or unknown when no known one differs; ok is false when none
// differs.
func (d *RankDiff) headlineCategory() (CategoryDiff, bool) {
	var unknown *CategoryDiff
	for i, c := range d.Categories { // the largest difference first
		switch {
		case c.DeltaBytes == 0:
		case c.Category != CatUnknown:
			return c, true
		case unknown == nil:
			unknown = &d.Categories[i]
		}
	}
	if unknown == nil {
		return CategoryDiff{}, false
	}
	return *unknown, true
}

func absI64(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

func diffSide(in DiffInput) DiffSide {
	a := in.A
	s := DiffSide{Label: in.Label, Rank: a.Rank, Source: in.Source, PeakAllocatedBytes: a.PeakAllocatedBytes,
		PeakBatch: a.PeakBatch, PeakPhase: a.PeakPhase, Complete: a.OtherSites == nil}
	if a.Events > 0 {
		s.PeakTimeUS = a.PeakAllocatedUS + in.ShiftUS
	}
	if a.Outside != nil {
		o := a.Outside.AtPeakBytes
		s.OutsideAllocatorBytes = &o
	}
	s.Truncated = a.Truncated != nil
	if a.Leak != nil {
		s.LeakPerBatchBytes = a.Leak.PerBatchBytes
	}
	return s
}

// withEarly is an analysis's sites, with what was allocated before recording as
// one more, and what its list leaves out as another.
func withEarly(a *RankAnalysis) []Site {
	out := append([]Site(nil), a.Sites...)
	if a.BeforeRecording != 0 {
		out = append(out, Site{Site: BeforeRecordingSite, Bytes: a.BeforeRecording})
	}
	if a.OtherSites != nil {
		out = append(out, *a.OtherSites)
	}
	return out
}

func absInt(v int64) uint64 {
	if v < 0 {
		return uint64(-v)
	}
	return uint64(v)
}

// WriteTable writes the diff as a table: the two peaks, then the sites, at most
// top of them (all when top <= 0), the largest difference first.
func (d *RankDiff) WriteTable(w io.Writer, top int) error {
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "\t%s\t%s\tdifference\t\n", d.Base.Label, d.Other.Label)
	fmt.Fprintf(tw, "peak allocated\t%s\t%s\t%s\t\n", human(d.Base.PeakAllocatedBytes), human(d.Other.PeakAllocatedBytes), Signed(d.PeakDeltaBytes))
	fmt.Fprintf(tw, "at batch\t%s\t%s\t\t\n", BatchText(d.Base.PeakBatch), BatchText(d.Other.PeakBatch))
	fmt.Fprintf(tw, "in phase\t%s\t%s\t\t\n", OrDash(d.Base.PeakPhase), OrDash(d.Other.PeakPhase))
	if b, o := d.Base.OutsideAllocatorBytes, d.Other.OutsideAllocatorBytes; b != nil || o != nil {
		delta := ""
		if b != nil && o != nil {
			delta = Signed(*o - *b)
		}
		fmt.Fprintf(tw, "outside allocator\t%s\t%s\t%s\t\n", optBytes(b), optBytes(o), delta)
	}
	if d.Base.LeakPerBatchBytes > 0 || d.Other.LeakPerBatchBytes > 0 {
		fmt.Fprintf(tw, "grows per batch\t%s\t%s\t\t\n", leakText(d.Base.LeakPerBatchBytes), leakText(d.Other.LeakPerBatchBytes))
	}
	if d.Base.Truncated || d.Other.Truncated {
		fmt.Fprintf(tw, "history\t%s\t%s\t\t\n", truncText(d.Base.Truncated), truncText(d.Other.Truncated))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(d.Categories) > 0 {
		fmt.Fprintf(w, "\nwhat each peak held, by category:\n")
		tw = tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "%s\t%s\tdifference\t  category\n", d.Base.Label, d.Other.Label)
		for _, c := range d.Categories {
			mod := ""
			if c.Module != "" {
				mod = fmt.Sprintf("  (most in %s: %s)", c.Module, Signed(c.ModuleDeltaBytes))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t  %s%s\n", human(c.BaseBytes), human(c.OtherBytes), Signed(c.DeltaBytes), CategoryText(c.Category), mod)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\nsites alive at each peak, largest difference first:\n")
	tw = tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\t%s\tdifference\t  site\n", d.Base.Label, d.Other.Label)
	for i, s := range d.Sites {
		if top > 0 && i == top {
			fmt.Fprintf(tw, "\t\t\t  (%d more sites; --top 0 shows all)\n", len(d.Sites)-top)
			break
		}
		note := OnlyText(d, s)
		if note != "" {
			note = "  (" + note + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t  %s%s\n", bytesOrDash(s.BaseBytes, s.BaseBlocks), bytesOrDash(s.OtherBytes, s.OtherBlocks),
			Signed(s.DeltaBytes), s.Site, note)
	}
	return tw.Flush()
}

// Signed writes a difference of bytes with its sign.
func Signed(n int64) string {
	if n > 0 {
		return "+" + human(n)
	}
	return human(n)
}

// BatchText writes a batch, or a dash for none.
func BatchText(b *int64) string {
	if b == nil {
		return "–"
	}
	return fmt.Sprint(*b)
}

// OrDash is s, or a dash when s is empty.
func OrDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func bytesOrDash(n int64, blocks int) string {
	if n == 0 && blocks == 0 {
		return "–"
	}
	return human(n)
}

// OnlyText names the side of a diff that alone holds a site, or is empty.
func OnlyText(d *RankDiff, s SiteDiff) string {
	switch s.Only {
	case "base":
		return "only " + d.Base.Label
	case "other":
		return "only " + d.Other.Label
	}
	return ""
}

// ShortLabel trims a path to its file name, for a diff's column header.
func ShortLabel(p string) string {
	if i := strings.LastIndexAny(p, "/\\"); i >= 0 {
		return p[i+1:]
	}
	return p
}

func optBytes(n *int64) string {
	if n == nil {
		return "—"
	}
	return human(*n)
}

func leakText(n int64) string {
	if n <= 0 {
		return "—"
	}
	return human(n)
}

func truncText(t bool) string {
	if t {
		return "truncated"
	}
	return "whole"
}
