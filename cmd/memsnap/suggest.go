package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// parseFlags parses args with fs. A usage error prints one line for what was
// wrong, the nearest flag where a flag was misspelt, and where the help is, not the
// whole help: that is for -h, which returns flag.ErrHelp. Other errors are errUsage.
func parseFlags(fs *flag.FlagSet, args []string) error {
	usage, out := fs.Usage, fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(out)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	}
	// (the flag package writes every flag as -name; the help writes --name)
	name, undefined := strings.CutPrefix(err.Error(), "flag provided but not defined: -")
	if !undefined {
		fmt.Fprintf(out, "%s: %v\n", fs.Name(), err)
	} else {
		fmt.Fprintf(out, "%s: flag provided but not defined: %s\n", fs.Name(), flagName(name))
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
		if near, ok := nearest(name, names); ok {
			fmt.Fprintf(out, "did you mean %s?\n", flagName(near))
		}
	}
	fmt.Fprintf(out, "Run '%s -h' for its flags.\n", fs.Name())
	return errUsage
}

// unknownCommand reports a command that is not one, with the nearest that is.
func unknownCommand(w io.Writer, name string) {
	fmt.Fprintf(w, "memsnap: unknown command %q\n", name)
	names := []string{"help", "version"}
	for n := range commands {
		names = append(names, n)
	}
	if near, ok := nearest(name, names); ok {
		fmt.Fprintf(w, "did you mean %q?\n", near)
	}
	fmt.Fprintln(w, "Run 'memsnap -h' for the commands.")
}

// flagName writes a flag as the help lists it: --name, or -x for one letter (as
// one-letter flags are written: -q, -v).
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// nearest returns the name closest to s by edit distance, when it is close enough
// to be a misspelling of it (at most a third of s's letters, and at least 2, wrong)
// and no other name is as close.
func nearest(s string, names []string) (string, bool) {
	best, bestD, tie := "", max(2, len(s)/3)+1, false
	for _, n := range names {
		switch d := editDistance(s, n); {
		case d < bestD:
			best, bestD, tie = n, d, false
		case d == bestD && n != best:
			tie = true
		}
	}
	return best, best != "" && !tie
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
