package main

import (
	"strings"
	"testing"
)

// TestFinishCommand: the flags reach commit.Finish's configuration (the full
// story, with agents killed and a store left behind, is TestLeaderKilledThenTeardown).
func TestFinishCommand(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		args          []string
		code          int
		stdout, inErr string
	}{
		{[]string{"finish", dir}, 0, "no run under " + dir + " has an unfinished window\n", ""},
		{[]string{"finish", "--run", "gpt", "--force", dir}, 1, "", "run gpt: no run's log in " + dir},
		{[]string{"finish", "--window", "x", dir}, 1, "", "--window: "},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args[:len(c.args)-1], " "), func(t *testing.T) {
			code, out, errOut := runCLI(t, c.args...)
			if code != c.code || out != c.stdout || !strings.Contains(errOut, c.inErr) {
				t.Fatalf("code %d out %q err %q; want %d %q %q", code, out, errOut, c.code, c.stdout, c.inErr)
			}
		})
	}
}
