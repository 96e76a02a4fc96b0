package cluster

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestMemberlistRefusalsAreSaid: gossip labelled for another run is a warning
// naming the label; a connection without any label (closed before it sent a
// byte) is not.
func TestMemberlistRefusalsAreSaid(t *testing.T) {
	var buf bytes.Buffer
	l := MemberlistLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	l.Printf(`[ERR] memberlist: discarding stream with unacceptable label "": from=127.0.0.1:4000`)
	if buf.Len() != 0 {
		t.Fatalf("an empty connection warned: %s", buf.String())
	}
	l.Printf(`[ERR] memberlist: discarding stream with unacceptable label "memsnap:other": from=127.0.0.1:4000`)
	if s := buf.String(); !strings.Contains(s, "labelled for another run") || !strings.Contains(s, "memsnap:other") || !strings.Contains(s, "127.0.0.1:4000") {
		t.Fatalf("warning %q", s)
	}
}
