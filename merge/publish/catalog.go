package publish

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/memsnap/memsnap/internal/store"
)

// maxManifest bounds how much of a manifest object is read.
const maxManifest = 64 << 20

// Published is one published merge found in a store.
type Published struct {
	Key      string // the manifest's key
	Manifest *Manifest
	ModTime  time.Time
	Err      error // set when the manifest could not be read or parsed
}

// Base is the outputs' common name, the manifest's key without ".manifest.json".
func (p Published) Base() string { return strings.TrimSuffix(p.Key, OutSuffix[OutManifest]) }

// ListPublished finds the manifests under prefix and reads them, oldest first. A
// manifest that cannot be read is returned with Err set, not dropped.
func ListPublished(ctx context.Context, st store.Store, prefix string) ([]Published, error) {
	objs, err := st.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	var out []Published
	for _, o := range objs {
		if !strings.HasSuffix(o.Key, OutSuffix[OutManifest]) {
			continue
		}
		p := Published{Key: o.Key, ModTime: o.ModTime}
		p.Manifest, p.Err = ReadManifest(ctx, st, o.Key)
		if errors.Is(p.Err, store.ErrNotFound) {
			continue // (removed since the listing, or only a claim: no commit)
		}
		out = append(out, p)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].ModTime.Before(out[j].ModTime) })
	return out, nil
}

// ReadManifest reads and parses one manifest.
func ReadManifest(ctx context.Context, st store.Store, key string) (*Manifest, error) {
	m, _, err := ReadManifestVersion(ctx, st, key)
	return m, err
}

// readManifestOrClaim reads and parses what is under a manifest's key (a
// claim included: Manifest.State says), with its version.
func readManifestOrClaim(ctx context.Context, st store.Store, key string) (*Manifest, string, error) {
	b, info, err := store.ReadObject(ctx, st, key, maxManifest)
	if err != nil {
		return nil, "", err
	}
	m, err := ParseManifest(b)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w: %w", key, errMalformed, err)
	}
	return m, info.ETag, nil
}

// ReadManifestVersion reads and parses one manifest, with the version (ETag) of
// what it read, for a conditional replace.
func ReadManifestVersion(ctx context.Context, st store.Store, key string) (*Manifest, string, error) {
	m, etag, err := readManifestOrClaim(ctx, st, key)
	if err != nil {
		return nil, "", err
	}
	if m.State == ManifestClaimed {
		return nil, "", fmt.Errorf("%s: %w (term %s)", key, ErrClaimed, m.Attempt)
	}
	return m, etag, nil
}

// OutputKey is the key of one of a published merge's outputs.
func (p Published) OutputKey(kind string) (string, bool) {
	o, ok := p.Manifest.Outputs[kind]
	if !ok {
		return "", false
	}
	return path.Join(path.Dir(p.Key), o.Name), true
}
