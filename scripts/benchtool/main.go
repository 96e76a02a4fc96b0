// Command benchtool supports the benchmark scripts: it generates large snapshots
// from a real one and times memsnap's own work on them.
//
//	benchtool gen -events N -ranks R -out DIR BASE.pickle   write rank{r}.1.memory_snapshot.pickle files
//	benchtool decode -n ITER FILE                           print the best decode time in seconds, and on
//	                                                        stderr what one decode allocates (-cpuprofile,
//	                                                        -memprofile F: write profiles)
//	benchtool merge -n ITER DIR                             merge DIR's ranks (all five outputs); print the best time and the peak RSS
//	benchtool decoded-size FILE                             print the heap bytes one decoded snapshot holds
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/internal/synth"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/merge/snapshot"
	"github.com/memsnap/memsnap/naming"
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
	case "merge":
		err = mergeBench(os.Args[2:])
	case "decoded-size":
		err = decodedSize(os.Args[2:])
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
	cpu := fs.String("cpuprofile", "", "write a CPU profile")
	mem := fs.String("memprofile", "", "write an allocation profile")
	fs.Parse(args)
	data, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	if *mem != "" {
		runtime.MemProfileRate = 4096
	}
	if *cpu != "" {
		f, err := os.Create(*cpu)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	best := time.Duration(1 << 62)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 0; i < *n; i++ {
		t := time.Now()
		if _, err := snapshot.Decode(data); err != nil {
			return err
		}
		best = min(best, time.Since(t))
	}
	runtime.ReadMemStats(&after)
	if *mem != "" {
		f, err := os.Create(*mem)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
			return err
		}
	}
	fmt.Printf("%.6f\n", best.Seconds())
	fmt.Fprintf(os.Stderr, "allocated per decode: %d bytes in %d objects, for %d bytes of input\n",
		(after.TotalAlloc-before.TotalAlloc)/uint64(*n), (after.Mallocs-before.Mallocs)/uint64(*n), len(data))
	return nil
}

func mergeBench(args []string) error {
	fs := flag.NewFlagSet("merge", flag.ExitOnError)
	n := fs.Int("n", 3, "iterations (the best is printed)")
	prof := fs.String("cpuprofile", "", "write a CPU profile")
	fs.Parse(args)
	if *prof != "" {
		f, err := os.Create(*prof)
		if err != nil {
			return err
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	best := time.Duration(1 << 62)
	for i := 0; i < *n; i++ {
		out, err := os.MkdirTemp("", "benchmerge-")
		if err != nil {
			return err
		}
		st, err := store.OpenDir(out, true)
		if err != nil {
			return err
		}
		r := &merge.Resolver{Template: naming.MustParse(naming.ComposerSnapshotName)}
		t := time.Now()
		ins, err := r.Resolve(context.Background(), []string{fs.Arg(0)}, nil)
		if err != nil {
			return err
		}
		if _, err := merge.Merge(context.Background(), merge.Config{Inputs: ins, Out: st}); err != nil {
			return err
		}
		best = min(best, time.Since(t))
		os.RemoveAll(out)
	}
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	fmt.Printf("%.6f %d\n", best.Seconds(), ru.Maxrss*1024)
	return nil
}

func decodedSize(args []string) error {
	data, err := os.ReadFile(args[0])
	if err != nil {
		return err
	}
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	s, err := snapshot.Decode(data)
	if err != nil {
		return err
	}
	runtime.GC()
	runtime.ReadMemStats(&b)
	runtime.KeepAlive(s)
	fmt.Println(b.HeapAlloc - a.HeapAlloc)
	return nil
}
