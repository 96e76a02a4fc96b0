package metrics

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/memsnap/memsnap/internal/bounded"
	"github.com/memsnap/memsnap/merge/analysis"
	"github.com/memsnap/memsnap/runlog"
)

// The agent's window endpoint: the tools that watch a job (a script, an alert)
// ask it for a window of every rank. Two routes on the metrics server, both
// POST, both behind a bearer token read from a file:
//
//	POST /api/v1/window        {"reason": "..."} (the body may be empty)
//	POST /api/v1/alertmanager  Alertmanager's webhook payload: a window for
//	                           its firing alerts, the alerts' names the reason
//
// Bodies are bounded (maxBody); a reason asked again within the cooldown is
// answered without a second window, and the windows asked of the leader,
// whatever their reasons, are at most WindowsPerMinute a minute (a token
// bucket): beyond it a request is refused with 429 and a Retry-After.

// maxBody bounds a request's body (an Alertmanager payload of many alerts fits).
const maxBody = 1 << 20

// maxReason bounds a window's reason.
const maxReason = 512

// API is what the endpoint needs: the token, and how to ask for a window.
type API struct {
	Token []byte
	// Ask asks the leader for a window of every rank, with reason; it returns
	// at once (the window is planned and published in the background).
	Ask      func(reason string) error
	Cooldown time.Duration // the least time between two windows of one reason
	// WindowsPerMinute bounds the windows this agent asks of the leader, whatever
	// their reasons: a bucket of as many, refilled at as many a minute (0:
	// DefaultWindowsPerMinute).
	WindowsPerMinute int

	mu     sync.Mutex
	asked  map[string]time.Time
	tokens float64   // the bucket's windows left
	filled time.Time // when tokens was last refilled
	now    func() time.Time
}

// DefaultWindowsPerMinute is the default bound of the windows one agent's API
// asks for a minute: a window stalls every rank for its batches.
const DefaultWindowsPerMinute = 4

// perMinute is WindowsPerMinute, or its default.
func (a *API) perMinute() int {
	if a.WindowsPerMinute <= 0 {
		return DefaultWindowsPerMinute
	}
	return a.WindowsPerMinute
}

// take takes a window from the bucket, or says how long until one is there.
// Called with a.mu held.
func (a *API) take() (ok bool, wait time.Duration) {
	n := a.perMinute()
	now := time.Now()
	if a.now != nil {
		now = a.now()
	}
	perSec := float64(n) / 60
	if a.filled.IsZero() {
		a.tokens = float64(n)
	} else if d := now.Sub(a.filled); d > 0 {
		a.tokens = min(float64(n), a.tokens+d.Seconds()*perSec)
	}
	a.filled = now
	if a.tokens >= 1 {
		a.tokens--
		return true, 0
	}
	return false, time.Duration((1 - a.tokens) / perSec * float64(time.Second))
}

// refuseRate answers a request beyond the bucket: 429, with a Retry-After in
// whole seconds.
func (a *API) refuseRate(w http.ResponseWriter, wait time.Duration) {
	n := a.perMinute()
	secs := int64(math.Ceil(wait.Seconds()))
	w.Header().Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
	reply(w, http.StatusTooManyRequests, "error", fmt.Sprintf("this agent asks the leader for at most %d windows a minute, whatever their reasons (--api-windows-per-minute); the next no sooner than in %d s", n, max(secs, 1)))
}

// LoadToken reads a bearer token from file: its owner's, not open to others
// (mode 600 or 640, as the gossip key's file), at most 4 KiB, surrounding space
// trimmed.
func LoadToken(file string) ([]byte, error) {
	if st, err := os.Stat(file); err == nil && !st.Mode().IsRegular() {
		return nil, fmt.Errorf("--api-token-file %s is not a regular file", file)
	}
	b, err := bounded.ReadSecretFile(file, "--api-token-file", 4096)
	if err != nil {
		return nil, err
	}
	t := []byte(strings.TrimSpace(string(b)))
	switch {
	case len(t) < 16:
		return nil, fmt.Errorf("--api-token-file %s: a token of at least 16 characters (memsnap keygen makes one)", file)
	case strings.IndexFunc(string(t), func(r rune) bool { return r <= ' ' || r > '~' }) >= 0:
		return nil, fmt.Errorf("--api-token-file %s: a token of printable ASCII without spaces (it goes in an HTTP header)", file)
	}
	return t, nil
}

func (a *API) routes(mux *http.ServeMux) {
	mux.HandleFunc("/api/v1/window", a.guard(a.window))
	mux.HandleFunc("/api/v1/alertmanager", a.guard(a.alertmanager))
}

// guard lets through a POST with the bearer token, its body bounded.
func (a *API) guard(next func(http.ResponseWriter, []byte)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			reply(w, http.StatusMethodNotAllowed, "error", "POST only")
			return
		}
		scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), a.Token) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="memsnap"`)
			reply(w, http.StatusUnauthorized, "error", "a bearer token is needed: the one in the agent's --api-token-file")
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				reply(w, http.StatusRequestEntityTooLarge, "error", fmt.Sprintf("a body of more than %d bytes", maxBody))
				return
			}
			reply(w, http.StatusBadRequest, "error", err.Error())
			return
		}
		next(w, body)
	}
}

func reply(w http.ResponseWriter, code int, key, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{key: msg})
}

func (a *API) window(w http.ResponseWriter, body []byte) {
	var req struct {
		Reason string `json:"reason"`
	}
	if len(strings.TrimSpace(string(body))) > 0 {
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || dec.More() {
			why := "more than one value"
			if err != nil {
				why = err.Error()
			}
			reply(w, http.StatusBadRequest, "error", "the body is {\"reason\": \"...\"}: "+why)
			return
		}
	}
	a.ask(w, runlog.ReasonAPI+nonEmpty(clean(req.Reason), "asked"))
}

// alertmanager takes Alertmanager's webhook payload (version 4): a window for
// its firing alerts, named by their alertname (and rank, when labelled).
func (a *API) alertmanager(w http.ResponseWriter, body []byte) {
	var p struct {
		Version string `json:"version"`
		Status  string `json:"status"`
		Alerts  []struct {
			Status string            `json:"status"`
			Labels map[string]string `json:"labels"`
		} `json:"alerts"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		reply(w, http.StatusBadRequest, "error", "not an Alertmanager webhook payload: "+err.Error())
		return
	}
	seen, names := map[string]bool{}, map[string]bool{}
	for _, al := range p.Alerts {
		if al.Status != "firing" {
			continue
		}
		name := nonEmpty(clean(al.Labels["alertname"]), "an alert")
		names[name] = true
		if rk := clean(al.Labels["rank"]); rk != "" {
			name += " (rank " + rk + ")"
		}
		seen[name] = true
	}
	if len(seen) == 0 {
		reply(w, http.StatusOK, "status", "no firing alert: nothing to do")
		return
	}
	alerts := make([]string, 0, len(seen))
	for n := range seen {
		alerts = append(alerts, n)
	}
	sort.Strings(alerts)
	if len(alerts) > 8 {
		alerts = append(alerts[:8], fmt.Sprintf("and %d more", len(alerts)-8))
	}
	// one window per cooldown for the same alerts, whichever ranks they name
	// now (an alert that spreads to more ranks is the same alert)
	key := make([]string, 0, len(names))
	for n := range names {
		key = append(key, n)
	}
	sort.Strings(key)
	a.askAs(w, runlog.ReasonAlert+strings.Join(alerts, ", "), "alertmanager: "+strings.Join(key, ", "))
}

// ask asks for a window with reason, unless one of the same reason was asked
// for within the cooldown.
func (a *API) ask(w http.ResponseWriter, reason string) { a.askAs(w, reason, reason) }

// askAs is ask with the cooldown kept under key.
func (a *API) askAs(w http.ResponseWriter, reason, key string) {
	reason = analysis.CutUTF8(reason, maxReason)
	a.mu.Lock()
	if a.asked == nil {
		a.asked = map[string]time.Time{}
	}
	if at, ok := a.asked[key]; ok && time.Since(at) < a.Cooldown {
		a.mu.Unlock()
		reply(w, http.StatusOK, "status", fmt.Sprintf("a window for %q was asked for at %s UTC; the next one no sooner than %s UTC", reason,
			at.UTC().Format(time.TimeOnly), at.Add(a.Cooldown).UTC().Format(time.TimeOnly)))
		return
	}
	for r, at := range a.asked { // (what is remembered stays small)
		if time.Since(at) >= a.Cooldown {
			delete(a.asked, r)
		}
	}
	if len(a.asked) >= 1024 {
		a.mu.Unlock()
		reply(w, http.StatusTooManyRequests, "error", "too many different reasons within the cooldown")
		return
	}
	if ok, wait := a.take(); !ok {
		a.mu.Unlock()
		a.refuseRate(w, wait)
		return
	}
	a.asked[key] = time.Now()
	a.mu.Unlock()
	if err := a.Ask(reason); err != nil {
		a.mu.Lock()
		delete(a.asked, key)
		a.tokens = min(a.tokens+1, float64(a.perMinute())) // no window was asked for
		a.mu.Unlock()
		reply(w, http.StatusServiceUnavailable, "error", err.Error())
		return
	}
	reply(w, http.StatusAccepted, "status", fmt.Sprintf("asked the leader for a window: %s (memsnap ls shows it once published)", reason))
}

// clean keeps a label printable (no control or bidi characters), valid UTF-8
// and short.
func clean(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || !unicode.IsPrint(r) && r != ' ' {
			return -1
		}
		return r
	}, strings.ToValidUTF8(strings.TrimSpace(s), ""))
	return analysis.CutUTF8(s, 128)
}

func nonEmpty(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
