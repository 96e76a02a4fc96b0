package cluster

import (
	"bytes"
	"log"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"time"
)

// refusals counts the attempts memberlist refused, by why, and says so at most
// once per refusalEvery per reason.
type refusals struct {
	mu    sync.Mutex
	count map[string]int
	said  map[string]time.Time
}

const refusalEvery = 10 * time.Second

// refusal patterns in memberlist's log lines, and what they mean for a user
var refusalKinds = []struct {
	re   *regexp.Regexp
	what string
}{
	{regexp.MustCompile(`unacceptable label "([^"]*)"`), "refused gossip labelled for another run"},
	{regexp.MustCompile(`(?i)no installed keys could decrypt`), "refused gossip that this run's key cannot decrypt (a member with another key)"},
	{regexp.MustCompile(`(?i)encryption is configured but remote state is not encrypted`), "refused unencrypted gossip (a member without a key, --insecure)"},
	{regexp.MustCompile(`Rejected node (\S+)`), "refused a member"},
}

var fromAddr = regexp.MustCompile(`(?:from=|\s)(\[?[0-9a-fA-F.:]+\]?:\d+)`)

// MemberlistLogger bridges memberlist's log lines into slog at Debug, and turns
// the lines that say memberlist refused someone into a rate-limited Warn.
func MemberlistLogger(l *slog.Logger) *log.Logger {
	w := &mlWriter{log: l.With("from", "memberlist"), ref: &refusals{count: map[string]int{}, said: map[string]time.Time{}}}
	return log.New(w, "", 0)
}

type mlWriter struct {
	log *slog.Logger
	ref *refusals
}

func (w *mlWriter) Write(p []byte) (int, error) {
	line := string(bytes.TrimSpace(p))
	for _, k := range refusalKinds {
		m := k.re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if k.what == refusalKinds[0].what && m[1] == "" {
			// no label at all: mostly a connection closed before it sent a byte
			// (a member going away, a port probe), which is no one's mistake
			w.log.Debug("a connection without a run label (closed before it sent anything, or gossip from outside memsnap)", "line", line)
			return len(p), nil
		}
		w.ref.mu.Lock()
		w.ref.count[k.what]++
		n := w.ref.count[k.what]
		say := time.Since(w.ref.said[k.what]) >= refusalEvery
		if say {
			w.ref.said[k.what] = time.Now()
			w.ref.count[k.what] = 0
		}
		w.ref.mu.Unlock()
		if say {
			attrs := []any{"count", n}
			if a := fromAddr.FindStringSubmatch(line); a != nil {
				attrs = append(attrs, "peer", a[1])
			}
			if len(m) > 1 {
				attrs = append(attrs, "detail", m[1])
			}
			w.log.Warn(k.what, attrs...)
		}
		return len(p), nil
	}
	level := slog.LevelDebug
	w.log.Log(nil, level, strings.TrimPrefix(line, "[DEBUG] "))
	return len(p), nil
}
