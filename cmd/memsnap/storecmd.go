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

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/naming"
)

// storeFlags are the flags every command that talks to a store shares.
type storeFlags struct {
	endpoint, accessKey, secretKey, region string
}

func (s *storeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.endpoint, "endpoint", "", "S3 endpoint, http(s)://host:port (default $S3_ENDPOINT_URL)")
	fs.StringVar(&s.accessKey, "access-key", "", "S3 access key (default $AWS_ACCESS_KEY_ID)")
	fs.StringVar(&s.secretKey, "secret-key", "", "S3 secret key (default $AWS_SECRET_ACCESS_KEY)")
	fs.StringVar(&s.region, "region", "", "S3 region (default $AWS_REGION)")
}

func (s *storeFlags) config(url string, create bool) store.Config {
	return store.Config{
		URL: url, Endpoint: s.endpoint, Region: s.region, CreateBucket: create,
		Credentials: store.Credentials{AccessKey: s.accessKey, SecretKey: s.secretKey},
	}
}

func init() {
	register(&command{
		name:    "ls",
		summary: "list the published merges (windows) under a store prefix, or with --objects every object",
		usage:   "[flags] s3://bucket/prefix | FOLDER",
		run:     runLs,
	})
	register(&command{
		name:    "get",
		summary: "download a published merge (its manifest), one object, or every object under a prefix; checksums verified",
		usage:   "[flags] s3://bucket/key-or-prefix [DEST]",
		run:     runGet,
	})
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
	var sf storeFlags
	sf.register(fs)
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		fs.Usage()
		return errUsage
	}
	st, prefix, err := openLocation(ctx, &sf, rest[0])
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
			fmt.Fprintf(tw, "%d\t%s\t %s\n", o.Size, o.ModTime.UTC().Format("2006-01-02 15:04:05"), o.Key)
		}
		tw.Flush()
		if len(objs) == 0 {
			fmt.Fprintf(stderr, "memsnap ls: nothing under %s\n", rest[0])
		}
		return nil
	}
	pubs, err := merge.ListPublished(ctx, st, prefix)
	if err != nil {
		return err
	}
	if len(pubs) == 0 {
		fmt.Fprintf(stderr, "memsnap ls: no published merge under %s (--objects lists every object)\n", rest[0])
		return nil
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, p := range pubs {
			line := struct {
				Key      string          `json:"key"`
				Error    string          `json:"error,omitempty"`
				Manifest *merge.Manifest `json:"manifest,omitempty"`
			}{Key: p.Key, Manifest: p.Manifest}
			if p.Err != nil {
				line.Error = p.Err.Error()
			}
			if err := enc.Encode(line); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "WINDOW\tBATCHES\tRANKS\tMISSING\tOUTLIER\tPUBLISHED\tOUTPUTS")
	for _, p := range pubs {
		if p.Err != nil {
			fmt.Fprintf(tw, "?\t\t\t\t\t%s\t%s: %v\n", p.ModTime.UTC().Format("2006-01-02 15:04:05"), p.Key, p.Err)
			continue
		}
		m := p.Manifest
		win, batches, outlier, missing := "-", "-", "-", "-"
		if m.Window != nil {
			win = strconv.FormatUint(m.Window.ID, 10)
			batches = fmt.Sprintf("%d-%d", m.Window.Start, m.Window.Stop-1)
		}
		if m.OutlierRank != nil {
			outlier = strconv.Itoa(*m.OutlierRank)
		}
		if len(m.MissingRanks) > 0 {
			missing = rankList(m.MissingRanks)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s\t%s\t%s\t%s.*\n", win, batches, len(m.RanksMerged), m.WorldSize, missing, outlier,
			p.ModTime.UTC().Format("2006-01-02 15:04:05"), p.Base())
	}
	return tw.Flush()
}

// rankList writes ranks compactly: 0-3,7.
func rankList(r []int) string {
	var b strings.Builder
	for i := 0; i < len(r); {
		j := i
		for j+1 < len(r) && r[j+1] == r[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", r[i], r[j])
		} else {
			fmt.Fprintf(&b, "%d", r[i])
		}
		i = j + 1
	}
	return b.String()
}

// getItem is one object to download.
type getItem struct {
	key, dest, sha string
}

func runGet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["get"], stderr)
	overwrite := fs.Bool("overwrite", false, "replace local files that hold other content")
	quiet := fs.Bool("q", false, "no progress on stderr")
	var sf storeFlags
	sf.register(fs)
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) < 1 || len(rest) > 2 {
		fs.Usage()
		return errUsage
	}
	dest := "."
	if len(rest) == 2 {
		dest = rest[1]
	}
	if !naming.IsS3(rest[0]) {
		return fmt.Errorf("%q is not an s3:// URL (local files need no get)", rest[0])
	}
	st, key, err := openLocation(ctx, &sf, rest[0])
	if err != nil {
		return err
	}
	items, err := getItems(ctx, st, key, strings.HasSuffix(rest[0], "/"), dest)
	if err != nil {
		return err
	}
	// refuse before downloading anything
	for i, it := range items {
		if it.sha == "" {
			info, err := st.Stat(ctx, it.key)
			if err != nil {
				return err
			}
			items[i].sha, it.sha = info.SHA256, info.SHA256
		}
		if _, err := store.CheckDestination(it.dest, it.sha, *overwrite); err != nil {
			return err
		}
	}
	tty := !*quiet && isTerminal(stderr)
	for _, it := range items {
		var progress func(done, total int64)
		if tty {
			progress = func(done, total int64) {
				fmt.Fprintf(stderr, "\r%s  %s / %s ", it.key, humanBytes(done), humanBytes(total))
			}
		}
		r, err := store.Download(ctx, st, it.key, it.dest, store.DownloadOptions{Overwrite: *overwrite, SHA256: it.sha, Progress: progress})
		if tty {
			fmt.Fprint(stderr, "\r\033[K")
		}
		if err != nil {
			return err
		}
		if !*quiet {
			what := "downloaded"
			if r.Skipped {
				what = "up to date"
			}
			check := "no checksum to verify"
			if r.Verified {
				check = "sha256 verified"
			}
			fmt.Fprintf(stderr, "%s %s (%s, %s)\n", what, it.key, humanBytes(r.Size), check)
		}
		fmt.Fprintln(stdout, r.Path)
	}
	return nil
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
		m, err := merge.ReadManifest(ctx, st, key)
		if err != nil {
			return nil, err
		}
		p := merge.Published{Key: key, Manifest: m}
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

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
