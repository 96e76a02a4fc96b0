// Command memsnap takes cluster-wide CUDA memory snapshots of multi-node training
// jobs. It only parses flags and wires the packages together; the work is done in
// naming, merge, rankagent, coordinator and internal/store.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	usage   string // the argument synopsis after the command name
	exits   string // the exit statuses, when not exitStatuses
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// exitStatuses are most commands' exit statuses.
const exitStatuses = "0 done; 1 it could not (the last line says why); 2 a usage error"

var commands = map[string]*command{}

func register(c *command) { commands[c.name] = c }

// errUsage is returned by a command after it printed its own usage message.
var errUsage = errors.New("usage")

// exitError carries a specific exit status.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	if path := os.Getenv("MEMSNAP_CPUPROFILE"); path != "" {
		// a whole process's CPU profile, for `go tool pprof` (developers)
		if f, err := os.Create(path); err == nil && pprof.StartCPUProfile(f) == nil {
			defer f.Close()
			defer pprof.StopCPUProfile()
		}
	}
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if code != 0 {
		pprof.StopCPUProfile()
		os.Exit(code)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		if len(args) > 1 {
			if c, ok := commands[args[1]]; ok {
				return runCommand(ctx, c, []string{"--help"}, stdout, stderr)
			}
		}
		mainUsage(stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "version" {
		fmt.Fprintln(stdout, "memsnap", version)
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		unknownCommand(stderr, args[0])
		return 2
	}
	return runCommand(ctx, c, args[1:], stdout, stderr)
}

func runCommand(ctx context.Context, c *command, args []string, stdout, stderr io.Writer) int {
	err := c.run(ctx, args, stdout, stderr)
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case errors.As(err, &ee):
		return ee.code
	default:
		fmt.Fprintf(stderr, "memsnap %s: %v\n", c.name, err)
		return 1
	}
}

const version = "0.1.0"

func mainUsage(w io.Writer) {
	fmt.Fprint(w, `memsnap takes cluster-wide CUDA memory snapshots of multi-node training jobs:
every rank records PyTorch's allocator history over the same batches, and the
per-rank snapshots are merged into one timeline, stored in MinIO/S3 or a folder.

Usage:
  memsnap <command> [flags] [arguments]

Commands:
`)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprint(w, `
Run 'memsnap <command> --help' for a command's flags.

Stores are s3://bucket/prefix URLs or local folders. For S3 the endpoint and
credentials come from --endpoint/--access-key/--secret-key or from
S3_ENDPOINT_URL, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
`)
}

// newFlags makes a FlagSet whose usage message reads like the rest of the tool.
func newFlags(c *command, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("memsnap "+c.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: memsnap %s %s\n\n%s\n", c.name, c.usage, c.summary)
		var has bool
		fs.VisitAll(func(*flag.Flag) { has = true })
		if has {
			fmt.Fprintln(stderr, "\nFlags:")
			printFlags(stderr, fs)
		}
		exits := c.exits
		if exits == "" {
			exits = exitStatuses
		}
		fmt.Fprintf(stderr, "\nExit status: %s.\n", exits)
	}
	return fs
}

// printFlags lists fs's flags as --name, each with its help, and its default
// where the help does not already say what it is.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, usage := flag.UnquoteUsage(f)
		line := "  " + flagName(f.Name)
		if name != "" {
			line += " " + name
		}
		fmt.Fprintf(w, "%s\n    \t%s", line, strings.ReplaceAll(usage, "\n", "\n    \t"))
		if d := f.DefValue; !strings.Contains(strings.ToLower(usage), "default") && d != "" && d != "0" && d != "false" && d != "-1" && d != "[]" {
			if _, isString := f.Value.(interface{ IsBoolFlag() bool }); !isString && name == "string" {
				d = strconv.Quote(d)
			}
			fmt.Fprintf(w, " (default %s)", d)
		}
		fmt.Fprintln(w)
	})
}

// parse parses flags, allowing them after positional arguments too.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if rest[0] == "--" {
			return append(pos, rest[1:]...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
