package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// runCLI runs the memsnap command line in-process.
func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

func TestNameCommand(t *testing.T) {
	cases := []struct {
		args     []string
		code     int
		out, err string
	}{
		{[]string{"name", "--template", "{run_name}/torch_traces/rank{rank}.{batch}.memory_snapshot", "--var", "run_name=gpt", "--var", "rank=3", "--var", "batch=5"},
			0, "gpt/torch_traces/rank3.5.memory_snapshot\n", ""},
		{[]string{"name", "--template", "{rank:06d}_step_{batch}.pickle", "--var", "rank=12", "--var", "batch=100"}, 0, "000012_step_100.pickle\n", ""},
		{[]string{"name", "--template", "/{run_name}/x", "--var", "run_name=r"}, 0, "r/x\n", ""},
		{[]string{"name", "--template", "rank{rnak}"}, 1, "", `unknown variable "rnak"`},
		{[]string{"name", "--template", "{run_name}/x", "--var", "run_name=../etc"}, 1, "", "escapes its prefix"},
		{[]string{"name", "--template", "{rank}", "--var", "rank=three"}, 1, "", "must be an integer"},
		{[]string{"name", "--template", "{rank}"}, 1, "", "missing value"},
		{[]string{"name", "--bogus"}, 2, "", "flag provided but not defined"},
		{[]string{"nosuch"}, 2, "", `unknown command "nosuch"`},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			code, out, errOut := runCLI(t, c.args...)
			if code != c.code || out != c.out || !strings.Contains(errOut, c.err) {
				t.Fatalf("code %d out %q err %q; want %d %q %q", code, out, errOut, c.code, c.out, c.err)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	code, out, _ := runCLI(t, "--help")
	if code != 0 || !strings.Contains(out, "Commands:") || !strings.Contains(out, "name") {
		t.Fatalf("--help: %d %q", code, out)
	}
	code, _, errOut := runCLI(t, "name", "--help")
	if code != 0 || !strings.Contains(errOut, "Usage: memsnap name") || !strings.Contains(errOut, "--template") {
		t.Fatalf("name --help: %d %q", code, errOut)
	}
	// every command says its exit statuses, and no default that its help explains
	// (or that means "not given") is printed after it
	for name := range commands {
		code, _, errOut := runCLI(t, name, "--help")
		if code != 0 || !strings.Contains(errOut, "\nExit status: ") || strings.Contains(errOut, "(default -1)") {
			t.Errorf("%s --help: %d\n%s", name, code, errOut)
		}
		for _, line := range strings.Split(errOut, "\n") {
			if strings.Count(line, "default") > 1 && strings.Contains(line, "(default ") {
				t.Errorf("%s --help says a default twice: %q", name, line)
			}
		}
	}
	// a usage line names the flags a command cannot do without
	if _, _, errOut := runCLI(t, "snapshot", "--help"); !strings.Contains(errOut, "Usage: memsnap snapshot --join HOST[:PORT] --run NAME (--key-file FILE") {
		t.Errorf("snapshot's usage line: %q", strings.SplitN(errOut, "\n", 2)[0])
	}
}

// TestUsageErrors: a misspelt flag or command gets a short message (what was
// wrong, the nearest name, where the help is) and exit status 2, not the help.
func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		want []string // stderr's lines, all of them
	}{
		{[]string{"agent", "--stor", "x"}, []string{"memsnap agent: flag provided but not defined: --stor", "did you mean --store?", "Run 'memsnap agent -h' for its flags."}},
		{[]string{"ls", "--objets", "x"}, []string{"memsnap ls: flag provided but not defined: --objets", "did you mean --objects?", "Run 'memsnap ls -h' for its flags."}},
		{[]string{"ls", "x", "-jsn"}, []string{"memsnap ls: flag provided but not defined: --jsn", "did you mean --json?", "Run 'memsnap ls -h' for its flags."}},
		{[]string{"ls", "--stor", "x"}, []string{"memsnap ls: flag provided but not defined: --stor", "Run 'memsnap ls -h' for its flags."}}, // no flag is near
		{[]string{"merge", "x", "--rank"}, []string{"memsnap merge: flag needs an argument: -rank", "Run 'memsnap merge -h' for its flags."}},
		{[]string{"mrege", "x"}, []string{`memsnap: unknown command "mrege"`, `did you mean "merge"?`, "Run 'memsnap -h' for the commands."}},
		{[]string{"verison"}, []string{`memsnap: unknown command "verison"`, `did you mean "version"?`, "Run 'memsnap -h' for the commands."}},
		{[]string{"zzzzzz"}, []string{`memsnap: unknown command "zzzzzz"`, "Run 'memsnap -h' for the commands."}},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			code, out, errOut := runCLI(t, c.args...)
			if want := strings.Join(c.want, "\n") + "\n"; code != 2 || out != "" || errOut != want {
				t.Fatalf("code %d out %q stderr:\n%s\nwant 2, no output, stderr:\n%s", code, out, errOut, want)
			}
		})
	}
}

// TestHelpFlag: -h still prints the whole help, through either flag parser.
func TestHelpFlag(t *testing.T) {
	for _, c := range []struct{ cmd, flag string }{{"ls", "--objects\n"}, {"agent", "--store string\n"}, {"merge", "--out string\n"}} {
		code, out, errOut := runCLI(t, c.cmd, "-h")
		for _, want := range []string{"Usage: memsnap " + c.cmd, "\nFlags:\n", "\n  " + c.flag, "\nExit status: "} {
			if code != 0 || out != "" || !strings.Contains(errOut, want) {
				t.Errorf("%s -h: code %d, stderr lacks %q:\n%s", c.cmd, code, want, errOut)
			}
		}
		if strings.Contains(errOut, "did you mean") || strings.Contains(errOut, "for its flags") {
			t.Errorf("%s -h reads as an error:\n%s", c.cmd, errOut)
		}
	}
	code, out, _ := runCLI(t, "-h")
	if code != 0 || !strings.Contains(out, "Commands:\n") || !strings.Contains(out, "\n  merge ") {
		t.Errorf("-h: %d %q", code, out)
	}
}

func TestNearest(t *testing.T) {
	names := []string{"store", "spool", "rank", "run-name", "json", "join"}
	for _, c := range []struct{ in, want string }{
		{"stor", "store"}, {"sotre", "store"}, {"rnak", "rank"}, {"runname", "run-name"},
		{"jsno", "json"}, {"xyz", ""}, {"stores-and-more", ""},
	} {
		got, ok := nearest(c.in, names)
		if got != c.want && (ok || c.want != "") {
			t.Errorf("nearest(%q) = %q, %v; want %q", c.in, got, ok, c.want)
		}
		if c.want == "" && ok {
			t.Errorf("nearest(%q) = %q; want none", c.in, got)
		}
	}
}
