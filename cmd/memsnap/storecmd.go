package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/memsnap/memsnap/internal/store"
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

// splitLocation splits s3://bucket/prefix/key or a local path into a store root and a key.
func splitLocation(loc string) (root, key string, err error) {
	if naming.IsS3(loc) {
		u, err := naming.ParseS3(loc)
		if err != nil {
			return "", "", err
		}
		return "s3://" + u.Bucket, u.Key, nil
	}
	return filepath.Dir(loc), filepath.Base(loc), nil
}

func init() {
	register(&command{
		name:    "ls",
		summary: "list stored snapshots and merged outputs under a prefix",
		usage:   "[flags] s3://bucket/prefix | FOLDER",
		run:     runLs,
	})
	register(&command{
		name:    "get",
		summary: "download stored objects (one key, or every key under a prefix) to a folder",
		usage:   "[flags] s3://bucket/key-or-prefix [DEST]",
		run:     runGet,
	})
}

func runLs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["ls"], stderr)
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
	root, prefix := rest[0], ""
	if naming.IsS3(rest[0]) {
		u, err := naming.ParseS3(rest[0])
		if err != nil {
			return err
		}
		root, prefix = "s3://"+u.Bucket, u.Key
	}
	st, err := store.Open(ctx, sf.config(root, false))
	if err != nil {
		return err
	}
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

func runGet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["get"], stderr)
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
	u, err := naming.ParseS3(rest[0])
	if err != nil {
		return err
	}
	st, err := store.Open(ctx, sf.config("s3://"+u.Bucket, false))
	if err != nil {
		return err
	}
	// One object, or everything under the prefix.
	var keys []string
	if u.Key != "" && !strings.HasSuffix(rest[0], "/") {
		if _, err := st.Stat(ctx, u.Key); err == nil {
			keys = []string{u.Key}
		} else if !errors.Is(err, store.ErrNotFound) {
			return err
		}
	}
	base := ""
	if keys == nil {
		pfx := u.Key
		if pfx != "" && !strings.HasSuffix(pfx, "/") {
			pfx += "/"
		}
		objs, err := st.List(ctx, pfx)
		if err != nil {
			return err
		}
		if len(objs) == 0 {
			return fmt.Errorf("nothing at %s", rest[0])
		}
		for _, o := range objs {
			keys = append(keys, o.Key)
		}
		base = pfx
	} else {
		base = path.Dir(u.Key) + "/"
	}
	for _, k := range keys {
		rel := strings.TrimPrefix(k, base)
		if _, err := naming.CleanKey(rel); err != nil {
			return err
		}
		out := filepath.Join(dest, filepath.FromSlash(rel))
		if err := download(ctx, st, k, out); err != nil {
			return err
		}
		fmt.Fprintln(stdout, out)
	}
	return nil
}

func download(ctx context.Context, st store.Store, key, out string) error {
	rc, _, err := st.Get(ctx, key)
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".memsnap-get-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, rc); err != nil {
		tmp.Close()
		return fmt.Errorf("downloading %s: %w", key, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}
