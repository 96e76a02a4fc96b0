package metrics

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// TestAPI: the window endpoint asks for a window only for a POST with the
// token, with a bounded body; Alertmanager's payload asks for one window for its
// firing alerts, named in the reason; a reason asked again within the cooldown
// asks nothing more.
func TestAPI(t *testing.T) {
	api, srv, asked := apiServer(t)
	post := func(path, token, body string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	tok := string(api.Token)
	for _, c := range []struct {
		path, token, body string
		code              int
	}{
		{"/api/v1/window", "", `{}`, 401},
		{"/api/v1/window", "wrong-token-0123456789", `{}`, 401},
		{"/api/v1/window", tok, `{"reason": 3}`, 400},
		{"/api/v1/window", tok, `{"reason": "x", "more": 1}`, 400},
		{"/api/v1/window", tok, `{"reason": "` + strings.Repeat("a", 2<<20) + `"}`, 413},
		{"/api/v1/alertmanager", tok, `not json`, 400},
		{"/api/v1/alertmanager", tok, `{"version":"4","status":"resolved","alerts":[{"status":"resolved","labels":{"alertname":"A"}}]}`, 200},
	} {
		if got := post(c.path, c.token, c.body); got != c.code {
			t.Errorf("POST %s %.40q: %d, want %d", c.path, c.body, got, c.code)
		}
	}
	if resp, err := http.Get(srv.URL + "/api/v1/window"); err != nil || resp.StatusCode != 405 {
		t.Fatalf("GET: %v %v", resp, err)
	}
	if len(*asked) != 0 {
		t.Fatalf("asked for %q", *asked)
	}
	if got := post("/api/v1/window", tok, `{"reason": "before the eval\nloop"}`); got != 202 {
		t.Fatalf("a good request: %d", got)
	}
	am := `{"version":"4","status":"firing","alerts":[{"status":"firing","labels":{"alertname":"MemsnapLowHeadroom","rank":"5"}},
		{"status":"firing","labels":{"alertname":"MemsnapLowHeadroom","rank":"5"}},{"status":"resolved","labels":{"alertname":"Gone"}}]}`
	if got := post("/api/v1/alertmanager", tok, am); got != 202 {
		t.Fatalf("alertmanager: %d", got)
	}
	if got := post("/api/v1/alertmanager", tok, am); got != 200 { // within the cooldown
		t.Fatalf("alertmanager again: %d", got)
	}
	if want := []string{"api: before the evalloop", "alert: MemsnapLowHeadroom (rank 5)"}; strings.Join(*asked, "|") != strings.Join(want, "|") {
		t.Fatalf("asked %q, want %q", *asked, want)
	}
}

func TestLoadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	if tok, err := LoadToken(write("good", "  a-token-of-enough-length\n", 0o600)); err != nil || string(tok) != "a-token-of-enough-length" {
		t.Fatalf("%q %v", tok, err)
	}
	for name, c := range map[string]struct {
		body string
		mode os.FileMode
	}{"open": {"a-token-of-enough-length", 0o644}, "short": {"short", 0o600}, "huge": {strings.Repeat("x", 5000), 0o600}} {
		if _, err := LoadToken(write(name, c.body, c.mode)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := LoadToken(filepath.Join(dir, "none")); err == nil {
		t.Error("a missing file: no error")
	}
}

// TestAPIHostileReasons: a long reason of many-byte characters is cut on a
// character's boundary (a reason that is not UTF-8 cannot be sent, and the
// window would never be planned); control and bidi characters are dropped; the
// scheme's case does not matter; an alert that spreads to more ranks within the
// cooldown asks for no second window.
func TestAPIHostileReasons(t *testing.T) {
	_, srv, asked := apiServer(t)
	post := func(path, scheme, body string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", scheme+" s3cret-token-0123456789")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	name := strings.Repeat("GPUメモリの残りが少なくなっています", 2) + "!"
	var alerts []string
	for r := 0; r < 8; r++ {
		alerts = append(alerts, fmt.Sprintf(`{"status":"firing","labels":{"alertname":%q,"rank":"%d"}}`, name, r))
	}
	if got := post("/api/v1/alertmanager", "bearer", `{"version":"4","alerts":[`+strings.Join(alerts, ",")+`]}`); got != 202 {
		t.Fatalf("many-byte alert names: %d", got)
	}
	if got := post("/api/v1/window", "Bearer", `{"reason":"`+strings.Repeat("a", 127)+`é\u202eevil\u0085"}`); got != 202 {
		t.Fatalf("a long reason: %d", got)
	}
	if got := post("/api/v1/window", "Bearer", `{"reason":"a"} {"reason":"b"}`); got != 400 {
		t.Fatalf("two values: %d", got)
	}
	spread := func(ranks ...int) string {
		var as []string
		for _, r := range ranks {
			as = append(as, fmt.Sprintf(`{"status":"firing","labels":{"alertname":"Low","rank":"%d"}}`, r))
		}
		return `{"version":"4","alerts":[` + strings.Join(as, ",") + `]}`
	}
	for i, ranks := range [][]int{{3}, {3, 5}, {3, 5, 7}, {7}} {
		want := 200
		if i == 0 {
			want = 202
		}
		if got := post("/api/v1/alertmanager", "Bearer", spread(ranks...)); got != want {
			t.Fatalf("alert on ranks %v: %d, want %d", ranks, got, want)
		}
	}
	if len(*asked) != 3 {
		t.Fatalf("asked %q", *asked)
	}
	for _, r := range *asked {
		if !utf8.ValidString(r) || strings.ContainsAny(r, "\u202e\u0085") {
			t.Fatalf("reason %q", r)
		}
	}
}

// TestAPIWindowsPerMinute: 200 windows asked with 200 different reasons ask the
// leader for only the bucket's windows; the others are refused with 429, a
// Retry-After and why; a window is back after a minute over the bound, and a
// reason asked again within its cooldown takes none.
func TestAPIWindowsPerMinute(t *testing.T) {
	api, srv, asked := apiServer(t)
	api.WindowsPerMinute = 5
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	api.now = func() time.Time { return clock }
	post := func(reason string) (int, string, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/v1/window", strings.NewReader(fmt.Sprintf(`{"reason":%q}`, reason)))
		req.Header.Set("Authorization", "Bearer "+string(api.Token))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
	}
	codes := map[int]int{}
	for i := range 200 {
		code, retry, body := post(fmt.Sprintf("reason %d", i))
		codes[code]++
		if code == 429 && (retry != "12" || !strings.Contains(body, "at most 5 windows a minute")) {
			t.Fatalf("request %d: 429 with Retry-After %q: %s", i, retry, body)
		}
	}
	if codes[202] != 5 || codes[429] != 195 || len(*asked) != 5 {
		t.Fatalf("answers %v, asked %d of the leader", codes, len(*asked))
	}
	if code, _, _ := post("reason 0"); code != 200 { // its cooldown, not the bucket
		t.Fatalf("a reason asked again: %d", code)
	}
	clock = clock.Add(12 * time.Second)
	if code, _, _ := post("reason 200"); code != 202 {
		t.Fatalf("a window a fifth of a minute later: %d", code)
	}
	if code, retry, _ := post("reason 201"); code != 429 || retry != "12" {
		t.Fatalf("the next: %d, Retry-After %q", code, retry)
	}
	if len(*asked) != 6 {
		t.Fatalf("asked %d of the leader", len(*asked))
	}
}

// apiServer serves an API whose asks are recorded, with a one-hour cooldown.
func apiServer(t *testing.T) (*API, *httptest.Server, *[]string) {
	asked := &[]string{}
	api := &API{Token: []byte("s3cret-token-0123456789"), Cooldown: time.Hour, Ask: func(r string) error { *asked = append(*asked, r); return nil }}
	mux := http.NewServeMux()
	api.routes(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return api, srv, asked
}
