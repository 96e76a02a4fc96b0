package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/termtext"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/publish"
	"github.com/memsnap/memsnap/naming"
	"github.com/memsnap/memsnap/runlog"
)

// storeFlags are the flags every command that talks to a store shares.
type storeFlags struct {
	endpoint, accessKey, secretKey, region, profile, caBundle string
}

func (s *storeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.endpoint, "endpoint", "", "S3 endpoint, http(s)://host:port (default $S3_ENDPOINT_URL, $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, or AWS S3 in the region)")
	fs.StringVar(&s.accessKey, "access-key", "", "S3 access key (default: the AWS credential chain, $AWS_ACCESS_KEY_ID first; docs/stores.md)")
	fs.StringVar(&s.secretKey, "secret-key", "", "S3 secret key (default: the AWS credential chain, $AWS_SECRET_ACCESS_KEY first)")
	fs.StringVar(&s.region, "region", "", "S3 region (default $AWS_REGION)")
	fs.StringVar(&s.profile, "profile", "", "profile of the AWS shared credentials file (default $AWS_PROFILE)")
	fs.StringVar(&s.caBundle, "ca-bundle", "", "PEM file of the certificate authorities an S3 endpoint's certificate is checked against (default $AWS_CA_BUNDLE)")
}

func (s *storeFlags) config(url string, create bool) store.Config {
	return store.Config{
		URL: url, Endpoint: s.endpoint, Region: s.region, Profile: s.profile, CABundle: s.caBundle, CreateBucket: create,
		Credentials: store.Credentials{AccessKey: s.accessKey, SecretKey: s.secretKey},
	}
}

// parseStore registers the store flags on fs and parses args. When want refuses
// the number of positional arguments, it prints the usage and returns errUsage.
func parseStore(fs *flag.FlagSet, args []string, want func(n int) bool) (*storeFlags, []string, error) {
	var sf storeFlags
	sf.register(fs)
	rest, err := parse(fs, args)
	if err != nil {
		return nil, nil, err
	}
	if !want(len(rest)) {
		fs.Usage()
		return nil, nil, errUsage
	}
	return &sf, rest, nil
}

// oneArg and someArgs are parseStore's usual wants.
func oneArg(n int) bool   { return n == 1 }
func someArgs(n int) bool { return n > 0 }

func init() {
	register(&command{
		name:    "ls",
		summary: "list every window of the runs under a store prefix (kind, how it ended, where its outputs are) and published merges, or with --objects every object",
		usage:   "[flags] s3://bucket/prefix | FOLDER",
		run:     runLs,
	})
	register(&command{
		name:    "get",
		summary: "download a published merge (its manifest), one object, or every object under a prefix; checksums verified",
		usage:   "[flags] s3://bucket/key-or-prefix | FOLDER | FILE [DEST]",
		run:     runGet,
	})
}

// getLocation opens what `get` copies from: an s3:// key or prefix, or a local
// folder (a shared filesystem's store) or file in one, whose copy is checked
// against the checksums a manifest names all the same.
func getLocation(ctx context.Context, sf *storeFlags, loc string) (store.Store, string, bool, error) {
	if naming.IsS3(loc) {
		st, key, err := openLocation(ctx, sf, loc)
		return st, key, strings.HasSuffix(loc, "/"), err
	}
	fi, err := os.Stat(loc)
	if err != nil {
		return nil, "", false, err
	}
	if fi.IsDir() {
		st, err := store.OpenDir(loc, false)
		return st, "", true, err
	}
	st, err := store.OpenDir(filepath.Dir(loc), false)
	return st, filepath.Base(loc), false, err
}

// openLocation opens the store holding loc (an s3:// URL or a folder) at its root
// (the bucket, or the folder itself) and returns the key or prefix loc names in it.
func openLocation(ctx context.Context, sf *storeFlags, loc string) (store.Store, string, error) {
	if naming.IsS3(loc) {
		u, err := naming.ParseS3(loc)
		if err != nil {
			return nil, "", err
		}
		st, err := store.Open(ctx, sf.config("s3://"+u.Bucket, false))
		return st, u.Key, err
	}
	st, err := store.Open(ctx, sf.config(loc, false))
	return st, "", err
}

func runLs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["ls"], stderr)
	objects := fs.Bool("objects", false, "list every object (size, time, key) instead of the published merges")
	asJSON := fs.Bool("json", false, "print one JSON object per published merge (its manifest, with its key)")
	sf, rest, err := parseStore(fs, args, oneArg)
	if err != nil {
		return err
	}
	st, prefix, err := openLocation(ctx, sf, rest[0])
	if err != nil {
		return err
	}
	if *objects {
		objs, err := st.List(ctx, prefix)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, o := range objs {
			fmt.Fprintf(tw, "%d\t%s\t %s\n", o.Size, o.ModTime.UTC().Format("2006-01-02 15:04:05"), printable(o.Key))
		}
		tw.Flush()
		if len(objs) == 0 {
			fmt.Fprintf(stderr, "memsnap ls: nothing under %s\n", rest[0])
		}
		return nil
	}
	rows, err := listWindows(ctx, st, prefix)
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		fmt.Fprintf(stderr, "memsnap ls: no window and no published merge under %s (--objects lists every object)\n", rest[0])
		return nil
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, r := range rows {
			if err := enc.Encode(r.json()); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tWINDOW\tKIND\tSTATE\tBATCHES\tRANKS\tMISSING\tOUTLIER\tTIME (UTC)\tREASON\tOUTPUTS / WHY")
	for _, r := range rows {
		fmt.Fprintln(tw, r.line(st))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	hintFinish(stderr, rest[0], rows)
	return nil
}

// hintFinish names, for each run with unfinished windows, the command that
// publishes them from the store when no agent of the run is left.
func hintFinish(w io.Writer, loc string, rows []windowRow) {
	type key struct{ run, at string }
	undone := map[key][]int{}
	var runs []key
	for _, r := range rows {
		if r.state == "unfinished" && r.plan != nil {
			k := key{r.plan.Run, agentsStore(loc, r.root)}
			if undone[k] == nil {
				runs = append(runs, k)
			}
			undone[k] = append(undone[k], int(r.id))
		}
	}
	for _, k := range runs {
		fmt.Fprintf(w, "memsnap ls: run %s has unfinished windows (%s): a live leader finishes them; with no agent of the run left, "+
			"`memsnap finish %s --run %s` publishes them from the store\n", printable(k.run), analysis.RankRanges(undone[k]), printable(shellQuote(k.at)), printable(shellQuote(k.run)))
	}
}

// agentsStore is the store the agents of a run whose log lies under root used,
// for ls given loc: an S3 listing's keys are the bucket's, a folder's its own.
func agentsStore(loc, root string) string {
	root = strings.TrimSuffix(root, "/")
	if naming.IsS3(loc) {
		u, err := naming.ParseS3(loc)
		if err != nil {
			return loc
		}
		return strings.TrimSuffix("s3://"+u.Bucket+"/"+root, "/")
	}
	if root == "" {
		return loc
	}
	return filepath.Join(loc, root)
}

// shellQuote quotes s for a POSIX shell where it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:@%+=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// windowRow is one line of `memsnap ls`: a window in a run's log (whatever its
// fate), or a published merge that belongs to no run's log (memsnap merge's).
type windowRow struct {
	run      string
	id       uint64
	kind     string // window, oom, crash; "merge" for a merge of files
	state    string // published, failed, unfinished
	plan     *runlog.Plan
	outcome  *runlog.Outcome
	pub      *publish.Published
	when     time.Time
	manifest string
	root     string // where the agents' store is, under the location listed
}

// listWindows reads the run logs and the manifests under prefix: every window a
// run planned, over all its launches, with its kind and how it ended.
func listWindows(ctx context.Context, st store.Store, prefix string) ([]windowRow, error) {
	objs, err := st.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var rows []windowRow
	claimed := map[string]bool{} // manifests a run's log names
	for _, run := range loggedRuns(objs) {
		rl := runlog.New(st, run)
		ids, err := rl.PlanIDs(ctx)
		if err != nil {
			return nil, err
		}
		for _, id := range ids {
			rows = append(rows, loggedWindow(ctx, st, rl, run, id, claimed))
		}
	}
	for _, o := range objs {
		if !strings.HasSuffix(o.Key, ".manifest.json") || claimed[o.Key] {
			continue
		}
		if row := mergeRow(ctx, st, o); row.pub == nil || !errors.Is(row.pub.Err, publish.ErrClaimed) {
			rows = append(rows, row) // (a leadership term's claim on a window's commit is no merge: its run's log lists the window)
		}
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].run != rows[j].run {
			return rows[i].run < rows[j].run
		}
		if rows[i].id != rows[j].id {
			return rows[i].id < rows[j].id
		}
		return rows[i].when.Before(rows[j].when)
	})
	return rows, nil
}

// loggedRuns are the runs whose logs (plans) are among objs, sorted.
func loggedRuns(objs []store.ObjectInfo) []string {
	runs := map[string]bool{}
	for _, o := range objs {
		if i := strings.Index(o.Key, "/memsnap/plans/window"); i >= 0 {
			runs[o.Key[:i]] = true
		}
	}
	names := make([]string, 0, len(runs))
	for r := range runs {
		names = append(names, r)
	}
	sort.Strings(names)
	return names
}

// loggedWindow is the row of window id in run's log rl: its plan, its outcome
// and its manifest; the manifest it names goes into claimed.
func loggedWindow(ctx context.Context, st store.Store, rl *runlog.Log, run string, id uint64, claimed map[string]bool) windowRow {
	row := windowRow{run: run, id: id, state: "unfinished"}
	// the log's keys are relative to the store the agents opened: its
	// root is what lies before the run's name here
	root := ""
	if p, err := rl.ReadPlan(ctx, id); err == nil {
		row.plan, row.kind, row.when = p, p.Kind, p.Created
		if p.Run != "" && strings.HasSuffix(run, p.Run) {
			root = strings.TrimSuffix(run, p.Run)
			row.run = p.Run
		}
		row.manifest, row.root = root+p.Manifest, root
	} else {
		row.state, row.kind = "unreadable: "+err.Error(), "?"
	}
	outcome := ""
	if o, err := rl.ReadOutcome(ctx, id); err == nil {
		row.outcome, outcome, row.when = o, o.State, o.Finished
		if o.Manifest != "" {
			row.manifest = root + o.Manifest
		}
	} else if errors.Is(err, runlog.ErrMalformed) {
		row.state = "outcome unreadable: " + err.Error()
	}
	// the manifest, the window's commit, is the truth when it is this
	// window's; the state is derived as the leader derives it
	var commit *window.Commit
	if row.manifest != "" {
		claimed[row.manifest] = true
		if m, err := publish.ReadManifest(ctx, st, row.manifest); err == nil && m.Window != nil && m.Window.ID == id {
			row.pub = &publish.Published{Key: row.manifest, Manifest: m}
			commit = &window.Commit{Failed: m.Failed(), Pending: len(m.Pending) > 0, Error: m.Error}
		}
	}
	if commit != nil || outcome != "" || !strings.HasPrefix(row.state, "unreadable") && !strings.HasPrefix(row.state, "outcome unreadable") {
		phase, final := window.Derive(commit, outcome)
		row.state = stateName(phase, final, row.pub)
	}
	return row
}

// mergeRow is the row of a published merge no run's log names (memsnap
// merge's), from its manifest o.
func mergeRow(ctx context.Context, st store.Store, o store.ObjectInfo) windowRow {
	p := publish.Published{Key: o.Key, ModTime: o.ModTime}
	p.Manifest, p.Err = publish.ReadManifest(ctx, st, o.Key)
	row := windowRow{kind: "merge", state: runlog.Published, pub: &p, when: o.ModTime, manifest: o.Key}
	if p.Err != nil {
		row.state = "unreadable: " + p.Err.Error()
	} else if row.state = publishedState(p.Manifest); p.Manifest.Window != nil {
		row.id = p.Manifest.Window.ID
		if p.Manifest.Kind != "" {
			row.kind = p.Manifest.Kind
		}
	}
	return row
}

// publishedState is a manifest's state for ls: published, failed, or answered
// while the merged pickles and the timeline are still being written.
func publishedState(m *publish.Manifest) string {
	switch {
	case m.Failed():
		return runlog.Failed
	case len(m.Pending) > 0:
		return "answered (" + strings.Join(m.Pending, ", ") + " pending)"
	}
	return runlog.Published
}

// stateName is a window's state as ls prints it (window.Derive's phase).
func stateName(p window.Phase, final bool, pub *publish.Published) string {
	switch p {
	case window.Published:
		return runlog.Published
	case window.Failed:
		return runlog.Failed
	case window.Answered:
		pending := "pickle, pb"
		if pub != nil && pub.Manifest != nil && len(pub.Manifest.Pending) > 0 {
			pending = strings.Join(pub.Manifest.Pending, ", ")
		}
		if final {
			return "answered (" + pending + " not written)"
		}
		return "answered (" + pending + " pending)"
	}
	return "unfinished"
}

// line is the row as ls prints it; its outputs are a URL `get` takes.
func (r windowRow) line(st store.Store) string {
	win, batches, ranks, missing, outlier, where := "-", "-", "-", "-", "-", ""
	if r.id != 0 {
		win = strconv.FormatUint(r.id, 10)
	}
	kind, reason := kindLabel(r.kind), "-"
	if r.plan != nil {
		kind = r.plan.Origin()
		if why := r.plan.ShortReason(); why != "" {
			reason = why
		}
	}
	if p := r.plan; p != nil && p.Stop > p.Start {
		batches = fmt.Sprintf("%d-%d", p.Start, p.Stop-1)
	}
	if r.pub != nil && r.pub.Manifest != nil && r.pub.Manifest.Failed() {
		m := r.pub.Manifest
		if m.Window != nil && m.Window.Stop > m.Window.Start {
			batches = fmt.Sprintf("%d-%d", m.Window.Start, m.Window.Stop-1)
		}
		ranks = fmt.Sprintf("0/%d", m.WorldSize)
		if len(m.MissingRanks) > 0 {
			missing = analysis.RankRanges(m.MissingRanks)
		}
		where = m.Error
	} else if r.pub != nil && r.pub.Manifest != nil {
		m := r.pub.Manifest
		if m.Window != nil && m.Window.Stop > m.Window.Start {
			batches = fmt.Sprintf("%d-%d", m.Window.Start, m.Window.Stop-1)
		}
		ranks = fmt.Sprintf("%d/%d", len(m.RanksMerged), m.WorldSize)
		if len(m.MissingRanks) > 0 {
			missing = analysis.RankRanges(m.MissingRanks)
		}
		if m.OutlierRank != nil {
			outlier = strconv.Itoa(*m.OutlierRank)
		}
		where = st.URL(r.pub.Base()) + ".*"
	} else if o := r.outcome; o != nil {
		ranks = fmt.Sprintf("%d/%d", len(o.Ranks), r.world())
		where = o.Error
		var ms []int
		for k := range o.Missing {
			if n, err := strconv.Atoi(k); err == nil {
				ms = append(ms, n)
			}
		}
		if len(ms) > 0 {
			sort.Ints(ms)
			missing = analysis.RankRanges(ms)
		}
	}
	when := "-"
	if !r.when.IsZero() {
		when = r.when.UTC().Format("2006-01-02 15:04:05")
	}
	run := r.run
	if run == "" {
		run = "-"
	}
	cols := []string{run, win, kind, r.state, batches, ranks, missing, outlier, when, printableN(reason, maxReason), where}
	for i, c := range cols {
		cols[i] = printable(c)
	}
	return strings.Join(cols, "\t")
}

// maxReason is how much of a window's reason ls shows (--json has it all).
const maxReason = 48

// printable makes text from the store or the cluster safe for one cell of a
// terminal table: tabs, newlines and other control characters (a terminal's
// escapes among them) are written as escapes (termtext.Escape), and it is cut
// at 300 bytes.
func printable(s string) string { return printableN(s, 300) }

// printableN is printable, cut at n bytes.
func printableN(s string, n int) string { return termtext.Escape(s, n) }

func (r windowRow) world() int {
	if r.plan != nil {
		return r.plan.WorldSize
	}
	return 0
}

func (r windowRow) json() any {
	out := struct {
		Run      string            `json:"run,omitempty"`
		Window   uint64            `json:"window,omitempty"`
		Kind     string            `json:"kind"`
		Origin   string            `json:"origin,omitempty"` // schedule, asked, alert, trigger or postmortem
		State    string            `json:"state"`
		Key      string            `json:"key,omitempty"` // the manifest's key
		Plan     *runlog.Plan      `json:"plan,omitempty"`
		Outcome  *runlog.Outcome   `json:"outcome,omitempty"`
		Manifest *publish.Manifest `json:"manifest,omitempty"`
		Error    string            `json:"error,omitempty"`
	}{Run: r.run, Window: r.id, Kind: r.kind, State: r.state, Plan: r.plan, Outcome: r.outcome}
	if r.plan != nil {
		out.Origin = r.plan.Origin()
	}
	if r.pub != nil {
		out.Key, out.Manifest = r.pub.Key, r.pub.Manifest
		if r.pub.Err != nil {
			out.Error = r.pub.Err.Error()
		}
	}
	return out
}

// getItem is one object to download.
type getItem struct {
	key, dest, sha string
}

func runGet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["get"], stderr)
	overwrite := fs.Bool("overwrite", false, "replace local files that hold other content")
	quiet := fs.Bool("q", false, "no progress on stderr")
	sf, rest, err := parseStore(fs, args, func(n int) bool { return n == 1 || n == 2 })
	if err != nil {
		return err
	}
	dest := "."
	if len(rest) == 2 {
		dest = rest[1]
	}
	st, key, isPrefix, err := getLocation(ctx, sf, rest[0])
	if err != nil {
		return err
	}
	defer st.Close()
	items, err := getItems(ctx, st, key, isPrefix, dest)
	if err != nil {
		return err
	}
	// manifests come last: a reader that finds one finds every output it names
	// whole (an interrupted download leaves no manifest over missing files)
	sort.SliceStable(items, func(i, j int) bool {
		return !strings.HasSuffix(items[i].key, ".manifest.json") && strings.HasSuffix(items[j].key, ".manifest.json")
	})
	// refuse before downloading anything
	replaced, err := checkDestinations(ctx, st, items, *overwrite)
	if err != nil {
		return err
	}
	// an old manifest goes before the files it named are replaced: never an old
	// manifest over new outputs, were the download to stop half-way
	for _, p := range replaced {
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("removing the manifest the download replaces: %w", err)
		}
	}
	tty := !*quiet && isTerminal(stderr)
	for k, it := range items {
		var progress func(done, total int64)
		if tty {
			progress = getProgress(stderr, k, len(items), it.key)
		}
		r, err := store.Download(ctx, st, it.key, it.dest, store.DownloadOptions{Overwrite: *overwrite, SHA256: it.sha, Progress: progress})
		if tty {
			fmt.Fprint(stderr, "\r\033[K")
		}
		if err != nil {
			return err
		}
		if !*quiet {
			printGot(stderr, it.key, r)
		}
		fmt.Fprintln(stdout, r.Path)
	}
	return nil
}

// checkDestinations refuses a download whose local files hold other content
// (unless overwrite), filling in the checksums items lack; it returns the
// manifests whose copies the download replaces.
func checkDestinations(ctx context.Context, st store.Store, items []getItem, overwrite bool) ([]string, error) {
	var replaced []string
	for i, it := range items {
		if it.sha == "" {
			info, err := st.Stat(ctx, it.key)
			if err != nil {
				return nil, err
			}
			items[i].sha, it.sha = info.SHA256, info.SHA256
		}
		same, err := store.CheckDestination(it.dest, it.sha, overwrite)
		if err != nil {
			return nil, err
		}
		if !same && strings.HasSuffix(it.key, ".manifest.json") {
			if _, err := os.Lstat(it.dest); err == nil {
				replaced = append(replaced, it.dest)
			}
		}
	}
	return replaced, nil
}

// getProgress shows the download of file k (of n) on a terminal: a few times a
// second, and at the end, not at every chunk read.
func getProgress(stderr io.Writer, k, n int, key string) func(done, total int64) {
	var last time.Time
	return func(done, total int64) {
		if now := time.Now(); done == total || now.Sub(last) >= progressEvery {
			last = now
			fmt.Fprintf(stderr, "\rfile %d of %d  %s  %s / %s \033[K", k+1, n, key, humanBytes(done), humanBytes(total))
		}
	}
}

// printGot says what get did with an object: downloaded or up to date, and
// whether its checksum was verified.
func printGot(stderr io.Writer, key string, r store.DownloadResult) {
	what := "downloaded"
	if r.Skipped {
		what = "up to date"
	}
	check := "no checksum to verify"
	if r.Verified {
		check = "sha256 verified"
	}
	fmt.Fprintf(stderr, "%s %s (%s, %s)\n", what, key, humanBytes(r.Size), check)
}

// getItems lists what `get` downloads: a manifest's outputs (checked against the
// manifest's checksums) and the manifest; one object; or every object under a
// prefix. Destinations keep the keys' layout below the prefix.
func getItems(ctx context.Context, st store.Store, key string, isPrefix bool, dest string) ([]getItem, error) {
	var items []getItem
	add := func(k, base, sha string) error {
		rel := strings.TrimPrefix(k, base)
		if _, err := naming.CleanKey(rel); err != nil {
			return err
		}
		items = append(items, getItem{key: k, dest: filepath.Join(dest, filepath.FromSlash(rel)), sha: sha})
		return nil
	}
	if strings.HasSuffix(key, ".manifest.json") && !isPrefix {
		m, err := publish.ReadManifest(ctx, st, key)
		if err != nil {
			return nil, err
		}
		if m.Failed() {
			what := "the window"
			if m.Window != nil {
				what = fmt.Sprintf("window %d", m.Window.ID)
			}
			return nil, fmt.Errorf("%s failed, with no outputs to get: %s (its manifest: %s)", what, m.Error, st.URL(key))
		}
		p := publish.Published{Key: key, Manifest: m}
		base := path.Dir(key) + "/"
		if base == "./" {
			base = ""
		}
		kinds := make([]string, 0, len(m.Outputs))
		for k := range m.Outputs {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		for _, kind := range kinds {
			k, _ := p.OutputKey(kind)
			if err := add(k, base, m.Outputs[kind].SHA256); err != nil {
				return nil, err
			}
		}
		if m.Claim.Name != "" && !strings.ContainsAny(m.Claim.Name, "/\\") {
			if err := add(path.Join(path.Dir(key), m.Claim.Name), base, m.Claim.SHA256); err != nil {
				return nil, err
			}
		}
		return items, add(key, base, "")
	}
	if key != "" && !isPrefix {
		if _, err := st.Stat(ctx, key); err == nil {
			base := path.Dir(key) + "/"
			if base == "./" {
				base = ""
			}
			return items, add(key, base, "")
		} else if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
	}
	pfx := key
	if pfx != "" && !strings.HasSuffix(pfx, "/") {
		pfx += "/"
	}
	objs, err := st.List(ctx, pfx)
	if err != nil {
		return nil, err
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("nothing at %s in %s", key, st)
	}
	for _, o := range objs {
		if err := add(o.Key, pfx, ""); err != nil {
			return nil, err
		}
	}
	return items, nil
}

// progressEvery is how often get redraws its progress on a terminal.
const progressEvery = 250 * time.Millisecond

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
