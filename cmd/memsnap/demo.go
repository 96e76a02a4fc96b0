package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/memsnap/memsnap/internal/demodata"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/naming"
)

func init() {
	register(&command{
		name:    "demo",
		summary: "run the whole job on embedded data: store 4 ranks' real snapshots in a folder and merge them",
		usage:   "[--out DIR]",
		run:     runDemo,
	})
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags(commands["demo"], stderr)
	out := fs.String("out", "memsnap-demo", "the folder store the demo writes to")
	quiet := fs.Bool("q", false, "no progress on stderr")
	if _, err := parse(fs, args); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *quiet {
		level = slog.LevelWarn
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	st, err := store.OpenDir(*out, true)
	if err != nil {
		return err
	}
	const run = "demo"
	folder := naming.MustParse(naming.DefaultRemoteFileName)
	file := naming.MustParse(naming.ComposerSnapshotName)
	var inputs []string
	for r := 0; r < demodata.Ranks; r++ {
		vars := naming.Vars{"run_name": run, "rank": r, "batch": 5}
		dir, err := folder.RenderKey(vars)
		if err != nil {
			return err
		}
		name, err := file.RenderKey(vars)
		if err != nil {
			return err
		}
		key, err := naming.Join(dir, name)
		if err != nil {
			return err
		}
		b, err := demodata.Rank(r)
		if err != nil {
			return err
		}
		if _, err := st.Put(ctx, key, bytes.NewReader(b), store.PutOptions{Overwrite: true}); err != nil {
			return err
		}
		log.Info("stored rank snapshot", "rank", r, "key", key, "bytes", len(b))
		inputs = append(inputs, filepath.Join(st.Root(), filepath.FromSlash(key)))
	}
	res := &merge.Resolver{Template: file}
	ins, err := res.Resolve(ctx, inputs, nil)
	if err != nil {
		return err
	}
	r, err := merge.Merge(ctx, merge.Config{
		Inputs: ins, Out: st, OutputBase: "{run_name}/merged/merged", Vars: naming.Vars{"run_name": run},
		Overwrite: true, Title: "demo (4-rank DDP, PyTorch 2.11, H200)", Logger: log,
	})
	if err != nil {
		return err
	}
	printMergeResult(stdout, st.String(), r)
	fmt.Fprintf(stdout, "open %s in a browser (it needs no network)\n", filepath.Join(st.Root(), filepath.FromSlash(r.Outputs[merge.OutHTML])))
	return nil
}
