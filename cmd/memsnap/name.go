package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/memsnap/memsnap/naming"
)

func init() {
	register(&command{
		name:    "name",
		summary: "render a rank-templated name as Composer would (Python str.format)",
		usage:   "--template T [--var key=value]...",
		run:     runName,
	})
}

func runName(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	c := commands["name"]
	fs := newFlags(c, stderr)
	tmpl := fs.String("template", naming.DefaultFolder+"/"+naming.DefaultFilename, "the name template, e.g. '{run_name}/rank{rank:06d}.{batch}'")
	var vars multiFlag
	fs.Var(&vars, "var", "a variable's value, key=value (repeatable); known: "+strings.Join(naming.VariableNames(), ", "))
	key := fs.Bool("key", true, "check the result as an object key (strip leading '/', refuse '..' and control characters)")
	rest, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("unexpected argument %q (pass variables with --var key=value)", rest[0])
	}
	t, err := naming.Parse(*tmpl)
	if err != nil {
		return err
	}
	v := naming.Vars{}
	for _, kv := range vars {
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("--var %q: want key=value", kv)
		}
		x, err := naming.ParseValue(k, val)
		if err != nil {
			return err
		}
		v[k] = x
	}
	var out string
	if *key {
		out, err = t.RenderKey(v)
	} else {
		out, err = t.Render(v)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, out)
	return nil
}
