// Command benchtool supports the benchmark scripts: it generates large snapshots
// from a real one and times memsnap's own work on them.
//
//	benchtool gen -events N -ranks R -out DIR BASE.pickle   write rank{r}.1.memory_snapshot.pickle files
//	benchtool decode -n ITER FILE                           print the best decode time in seconds
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/memsnap/memsnap/internal/synth"
	"github.com/memsnap/memsnap/merge/snapshot"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: benchtool gen|decode ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "gen":
		err = gen(os.Args[2:])
	case "decode":
		err = decode(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtool:", err)
		os.Exit(1)
	}
}

func gen(args []string) error {
	fs := flag.NewFlagSet("gen", flag.ExitOnError)
	events := fs.Int("events", 100000, "trace events per rank")
	ranks := fs.Int("ranks", 1, "ranks to write")
	out := fs.String("out", ".", "output folder")
	fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("gen needs one base snapshot")
	}
	base, err := snapshot.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	for r := 0; r < *ranks; r++ {
		s := synth.Grow(base, *events, int64(r)*4096)
		b, err := snapshot.EncodeBytes(s)
		if err != nil {
			return err
		}
		p := filepath.Join(*out, fmt.Sprintf("rank%d.1.memory_snapshot.pickle", r))
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
		fmt.Printf("%s: %d events, %d bytes\n", p, len(s.DeviceTraces[0]), len(b))
	}
	return nil
}

func decode(args []string) error {
	fs := flag.NewFlagSet("decode", flag.ExitOnError)
	n := fs.Int("n", 10, "iterations (the best is printed)")
	fs.Parse(args)
	data, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	best := time.Duration(1 << 62)
	for i := 0; i < *n; i++ {
		t := time.Now()
		if _, err := snapshot.Decode(data); err != nil {
			return err
		}
		best = min(best, time.Since(t))
	}
	fmt.Printf("%.6f\n", best.Seconds())
	return nil
}
