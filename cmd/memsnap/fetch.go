package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/merge/sidecar"
	"github.com/memsnap/memsnap/naming"
)

// fetched is a command's input where it can be read as a local file: itself, or,
// for an s3:// URL, a checksum-checked copy in a temporary folder with the
// sidecar and the analysis that lie beside it in the store.
type fetched struct {
	tmp string
}

// local returns a local path for loc, fetching an s3:// object (and its
// sidecars) first.
func (f *fetched) local(ctx context.Context, sf *storeFlags, loc string) (string, error) {
	if !naming.IsS3(loc) {
		return loc, nil
	}
	st, key, err := openLocation(ctx, sf, loc)
	if err != nil {
		return "", err
	}
	defer st.Close()
	if key == "" {
		return "", fmt.Errorf("%s names a bucket, not an object", loc)
	}
	if f.tmp == "" {
		if f.tmp, err = os.MkdirTemp("", store.OwnedPattern("memsnap-fetch-")); err != nil {
			return "", err
		}
	}
	dir, err := os.MkdirTemp(f.tmp, "in")
	if err != nil {
		return "", err
	}
	dest := filepath.Join(dir, path.Base(key))
	if _, err := store.Download(ctx, st, key, dest, store.DownloadOptions{}); err != nil {
		return "", fmt.Errorf("fetching %s: %w", loc, err)
	}
	for _, side := range []string{sidecar.MetaName(key), analysis.AnalysisName(key)} {
		if side == key {
			continue
		}
		_, err := store.Download(ctx, st, side, filepath.Join(dir, path.Base(side)), store.DownloadOptions{})
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return "", fmt.Errorf("fetching %s's %s: %w", loc, path.Base(side), err)
		}
	}
	return dest, nil
}

// done removes what was fetched.
func (f *fetched) done() {
	if f.tmp != "" {
		os.RemoveAll(f.tmp)
	}
}
