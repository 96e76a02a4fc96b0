package naming

import (
	"encoding/json"
	"errors"
	"math"
	"os/exec"
	"strings"
	"testing"

	"github.com/memsnap/memsnap/internal/testutil"
)

var composerVars = Vars{
	"run_name": "gpt-125m", "rank": 3, "local_rank": 3, "node_rank": 0, "world_size": 8,
	"local_world_size": 8, "epoch": 1, "batch": 5, "batch_in_epoch": 5, "sample": 640,
	"sample_in_epoch": 640, "token": 1310720, "token_in_epoch": 1310720,
	"total_wct": 12.5, "epoch_wct": 3.25, "batch_wct": 0.125, "window": 7,
}

func TestRenderTable(t *testing.T) {
	cases := []struct {
		tmpl string
		want string
	}{
		{"{run_name}/torch_traces/rank{rank}.{batch}.memory_snapshot", "gpt-125m/torch_traces/rank3.5.memory_snapshot"},
		{DefaultFolder, "gpt-125m/torch_traces"},
		{DefaultFilename, "rank3.5.memory_snapshot"},
		{DefaultRemoteFileName, "gpt-125m/torch_memory_traces"},
		{ComposerSnapshotName, "rank3.5.memory_snapshot.pickle"},
		{TorchtitanSnapshotName, "000003_step_5.pickle"},
		{"ep{epoch}-ba{batch}-rank{rank}", "ep1-ba5-rank3"},
		{"{{literal}}/{rank:>5}|", "{literal}/    3|"},
		{"{run_name:.3}", "gpt"},
		{"{run_name:*^12}", "**gpt-125m**"},
		{"{run_name:05}", "gpt-125m"},
		{"{rank:06d}", "000003"},
		{"{rank:+}", "+3"},
		{"{rank:#x}/{rank:#010b}", "0x3/0b00000011"},
		{"{token:,}", "1,310,720"},
		{"{token:_x}", "14_0000"},
		{"{token:012,}", "0,001,310,720"},
		{"{total_wct}", "12.5"},
		{"{total_wct:.3f}", "12.500"},
		{"{batch_wct:e}", "1.250000e-01"},
		{"{epoch_wct:g}", "3.25"},
		{"{total_wct:.0%}", "1250%"},
		{"{rank:.2f}", "3.00"},
		{"{window:04d}-{world_size}", "0007-8"},
		{"{sample_in_epoch:<6}|", "640   |"},
		{"{rank:=+5}", "+   3"},
	}
	for _, c := range cases {
		t.Run(c.tmpl, func(t *testing.T) {
			tm, err := Parse(c.tmpl)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tm.Render(composerVars)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct{ tmpl, wantSub string }{
		{"rank{rnak}", `unknown variable "rnak"`},
		{"rank{rank", "unclosed '{'"},
		{"rank}", "single '}'"},
		{"{}", "positional"},
		{"{0}", "unknown variable"},
		{"{rank!r}", "conversions"},
		{"{rank.real}", "attribute"},
		{"{rank:.2d}", "precision not allowed"},
		{"{run_name:d}", "unknown format code 'd'"},
		{"{run_name:+}", "sign not allowed"},
		{"{run_name:=5}", "'=' alignment"},
		{"{rank:q}", "unknown format code 'q'"},
		{"{rank:{batch}}", "nested"},
		{"{rank:5d3}", "invalid format specifier"},
		{"{rank:99999}", "too large"},
		{"{rank:c}", "not supported"},
		{"{rank:,x}", "cannot specify ','"},
		{"{rank:,_}", "cannot specify both"},
		{"{rank:_n}", "cannot specify '_' with 'n'"},
		{"{run_name:,}", "cannot specify ',' with 's'"},
		{"{run_name:\x00}", "unknown format code"},
		{"{rank:5\x00}", "unknown format code"},
		{"{total_wct:.2147483648g}", "precision too big"},
		{"{total_wct:.1025f}", "too large"},
		{"{total_wct:#.1025g}", "too large"},
		{"{rank:.99999999999999999999}", "too many decimal digits"},
	}
	for _, c := range cases {
		t.Run(c.tmpl, func(t *testing.T) {
			_, err := Parse(c.tmpl)
			if err == nil || !strings.Contains(err.Error(), c.wantSub) {
				t.Fatalf("Parse(%q) = %v, want error containing %q", c.tmpl, err, c.wantSub)
			}
		})
	}
	_, err := Parse("{nope}")
	if !errors.Is(err, ErrUnknownVariable) {
		t.Fatalf("want ErrUnknownVariable, got %v", err)
	}
}

// TestFormatDivergencesFixed holds specs memsnap once rendered differently from
// CPython's str.format; want is what Python 3.11 to 3.13 give.
func TestFormatDivergencesFixed(t *testing.T) {
	cases := []struct {
		tmpl string
		vars Vars
		want string
	}{
		// '0' sets the fill even with an explicit alignment.
		{"{run_name:>05}", Vars{"run_name": "ab"}, "000ab"},
		{"{run_name:^07}", Vars{"run_name": "ab"}, "00ab000"},
		{"{rank:<05}", Vars{"rank": 3}, "30000"},
		{"{rank:^+07x}", Vars{"rank": 255}, "00+ff00"},
		{"{epoch_wct:>010.2f}", Vars{"epoch_wct": 3.25}, "0000003.25"},
		// No type with a precision: exponent notation from exp >= precision-1.
		{"{total_wct:.0}", Vars{"total_wct": 2.0}, "2e+00"},
		{"{total_wct:.1}", Vars{"total_wct": 0.0}, "0e+00"},
		{"{total_wct:.0}", Vars{"total_wct": 12.5}, "1e+01"},
		// '#' keeps the point of a one-digit mantissa.
		{"{batch_wct:#}", Vars{"batch_wct": 1e-05}, "1.e-05"},
		{"{total_wct:#}", Vars{"total_wct": 1e16}, "1.e+16"},
		{"{total_wct:#.1g}", Vars{"total_wct": 20.0}, "2.e+01"},
		{"{total_wct:#.0}", Vars{"total_wct": 0.0}, "0.e+00"},
		// '%' scales first: the largest float becomes inf.
		{"{total_wct:%}", Vars{"total_wct": math.MaxFloat64}, "inf%"},
		{"{total_wct:z,%}", Vars{"total_wct": -math.MaxFloat64}, "-inf%"},
		// Zero padding of inf and nan with grouping.
		{"{total_wct:010,}", Vars{"total_wct": math.Inf(1)}, "0000000inf"},
		{"{total_wct:+010_}", Vars{"total_wct": math.NaN()}, "+000000nan"},
		// Precisions above MaxKeyLen that can still make a short name.
		{"{total_wct:.1025g}", Vars{"total_wct": 1.5}, "1.5"},
		{"{run_name:.2000}", Vars{"run_name": "ab"}, "ab"},
		// A NUL type is no type for float.
		{"{total_wct:5\x00}", Vars{"total_wct": 1.5}, "  1.5"},
		// Zero-filled grouping completes a group rather than start with a separator.
		{"{token:0=12,}", Vars{"token": 1234}, "0,000,001,234"},
		{"{token:08,}", Vars{"token": 1234}, "0,001,234"},
	}
	for _, c := range cases {
		t.Run(c.tmpl, func(t *testing.T) {
			tm, err := Parse(c.tmpl)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tm.Render(c.vars)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("got %q, want %q", got, c.want)
			}
		})
	}
}

func TestRenderMissingAndWrongType(t *testing.T) {
	tm := MustParse("rank{rank}.{batch}")
	if _, err := tm.Render(Vars{"rank": 1}); !errors.Is(err, ErrMissingValue) {
		t.Fatalf("want ErrMissingValue, got %v", err)
	}
	if _, err := tm.Render(Vars{"rank": "one", "batch": 2}); err == nil {
		t.Fatal("a string for an int variable must fail")
	}
}

func TestCleanKey(t *testing.T) {
	long := strings.Repeat("a", MaxKeyLen+1)
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"/run/rank0.pickle", "run/rank0.pickle", true},
		{"///a/b", "a/b", true},
		{"a/../b", "", false},
		{"..", "", false},
		{"a/..", "", false},
		{"a/..b/c", "a/..b/c", true},
		{"a\x00b", "", false},
		{"a\nb", "", false},
		{"", "", false},
		{"/", "", false},
		{long, "", false},
		{strings.Repeat("a", MaxKeyLen), strings.Repeat("a", MaxKeyLen), true},
		{"bad\xffutf8", "", false},
	}
	for _, c := range cases {
		got, err := CleanKey(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("CleanKey(%q) = %q, %v; want %q ok=%v", c.in, got, err, c.want, c.ok)
		}
		if err != nil && !errors.Is(err, ErrBadKey) {
			t.Errorf("CleanKey(%q) error %v does not wrap ErrBadKey", c.in, err)
		}
	}
	// A value, not the template, can escape too.
	tm := MustParse("{run_name}/rank{rank}")
	if _, err := tm.RenderKey(Vars{"run_name": "../etc", "rank": 0}); err == nil {
		t.Fatal("a run_name of ../etc must be refused")
	}
}

func TestParseS3(t *testing.T) {
	cases := []struct {
		in     string
		bucket string
		key    string
		ok     bool
	}{
		{"s3://my-bucket/runs/a", "my-bucket", "runs/a", true},
		{"s3://my-bucket", "my-bucket", "", true},
		{"s3://my-bucket/", "my-bucket", "", true},
		{"s3://my-bucket//lead/slash", "my-bucket", "lead/slash", true},
		{"s3://My_Bucket/x", "", "", false},
		{"s3://ab/x", "", "", false},
		{"s3://bucket/../x", "", "", false},
		{"gs://bucket/x", "", "", false},
		{"s3://-bucket/x", "", "", false},
	}
	for _, c := range cases {
		u, err := ParseS3(c.in)
		if (err == nil) != c.ok || u.Bucket != c.bucket || u.Key != c.key {
			t.Errorf("ParseS3(%q) = %+v, %v", c.in, u, err)
		}
	}
}

// TestAgainstPython renders every case with CPython's str.format and with ours.
func TestAgainstPython(t *testing.T) {
	py := testutil.Python(t)
	tmpls := []string{
		"{run_name}/torch_traces/rank{rank}.{batch}.memory_snapshot", TorchtitanSnapshotName,
		"{rank:06d}", "{rank:>5}", "{rank:<5}|", "{rank:^7}|", "{rank:x^7}", "{rank:=+8}", "{rank: }",
		"{rank:#o}", "{rank:#X}", "{rank:b}", "{token:,}", "{token:_}", "{token:_b}", "{token:015,}",
		"{token:e}", "{token:.3g}", "{token:%}", "{run_name:.4}", "{run_name:>12.4}", "{run_name:_^11}",
		"{run_name:05}", "{total_wct}", "{epoch_wct:.1f}", "{batch_wct:.3}", "{batch_wct:g}",
		"{batch_wct:#.3g}", "{total_wct:10.2e}", "{total_wct:+.2%}", "{epoch_wct:z.1f}", "{total_wct:,.2f}",
		"{total_wct:012.3f}", "{batch_wct:G}", "{total_wct:.0f}", "{total_wct:#.0f}", "{total_wct:n}",
		"{{x}}{rank}{{", "}}{world_size}", "{sample:08_d}",
	}
	values := []Vars{
		composerVars,
		{"run_name": "r", "rank": -42, "token": -1234567, "total_wct": 1234567.0, "epoch_wct": -0.04, "batch_wct": 1e-7, "world_size": 0, "sample": 123456},
		{"run_name": "", "rank": 0, "token": 0, "total_wct": 1e16, "epoch_wct": 0.0001, "batch_wct": 123456789.125, "world_size": 1, "sample": 0},
		{"run_name": "ünï", "rank": 255, "token": 65535, "total_wct": 0.0, "epoch_wct": 2.5, "batch_wct": 1e22, "world_size": 64, "sample": -5},
	}
	type job struct {
		T string         `json:"t"`
		V map[string]any `json:"v"`
	}
	var jobs []job
	for _, tm := range tmpls {
		for _, v := range values {
			full := map[string]any{}
			for k, x := range composerVars {
				full[k] = x
			}
			for k, x := range v {
				full[k] = x
			}
			jobs = append(jobs, job{tm, full})
		}
	}
	in, _ := json.Marshal(jobs)
	script := `import json,sys
out=[]
for j in json.load(sys.stdin):
    v=dict(j["v"])
    for k in ("total_wct","epoch_wct","batch_wct"):
        if k in v: v[k]=float(v[k])
    out.append(j["t"].format(**v))
print(json.dumps(out))`
	cmd := exec.Command(py, "-c", script)
	cmd.Stdin = strings.NewReader(string(in))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	outb, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v: %s", err, stderr.String())
	}
	var want []string
	if err := json.Unmarshal(outb, &want); err != nil {
		t.Fatal(err)
	}
	for i, j := range jobs {
		tm, err := Parse(j.T)
		if err != nil {
			t.Errorf("Parse(%q): %v", j.T, err)
			continue
		}
		got, err := tm.Render(Vars(j.V).normalized())
		if err != nil {
			t.Errorf("Render(%q): %v", j.T, err)
			continue
		}
		if got != want[i] {
			t.Errorf("%q with %v: got %q, python %q", j.T, j.V, got, want[i])
		}
	}
}

// normalized turns JSON-decoded numbers back into the types Vars expects.
func (v Vars) normalized() Vars {
	out := Vars{}
	for k, x := range v {
		switch Variables[k] {
		case KindInt:
			switch n := x.(type) {
			case float64:
				out[k] = int64(n)
			default:
				out[k] = x
			}
		default:
			out[k] = x
		}
	}
	return out
}

func FuzzTemplate(f *testing.F) {
	for _, s := range []string{DefaultFolder, DefaultFilename, TorchtitanSnapshotName, "{rank:06d}", "{{}}", "{run_name:.3}", "{total_wct:+012.3e}", "{rank:x^#20_b}"} {
		f.Add(s, "run", int64(3), 1.5)
	}
	f.Fuzz(func(t *testing.T, tmpl, run string, n int64, x float64) {
		tm, err := Parse(tmpl)
		if err != nil {
			return
		}
		vars := Vars{}
		for name, k := range Variables {
			switch k {
			case KindString:
				vars[name] = run
			case KindInt:
				vars[name] = n
			default:
				vars[name] = x
			}
		}
		s, err := tm.Render(vars)
		if err != nil {
			t.Fatalf("a parsed template failed to render: %v", err)
		}
		if k, err := CleanKey(s); err == nil {
			if strings.HasPrefix(k, "/") || len(k) > MaxKeyLen {
				t.Fatalf("CleanKey let %q through", k)
			}
			for _, seg := range strings.Split(k, "/") {
				if seg == ".." {
					t.Fatalf("CleanKey let a '..' segment through: %q", k)
				}
			}
		}
	})
}

func TestMatch(t *testing.T) {
	cases := []struct {
		tmpl, name string
		ok         bool
		rank       int64
	}{
		{ComposerSnapshotName, "rank3.5.memory_snapshot.pickle", true, 3},
		{ComposerSnapshotName, "rank12.100.memory_snapshot.pickle", true, 12},
		{ComposerSnapshotName, "rankx.5.memory_snapshot.pickle", false, 0},
		{ComposerSnapshotName, "rank3.5.memory_snapshot.html", false, 0},
		{TorchtitanSnapshotName, "000007_step_30.pickle", true, 7},
		{"{run_name}_{rank}.pickle", "snapshot_rank_3.pickle", true, 3},
		{"r{rank}-{rank}.p", "r1-2.p", false, 0},
		{"r{rank}-{rank}.p", "r2-2.p", true, 2},
	}
	for _, c := range cases {
		v, ok := MustParse(c.tmpl).Match(c.name)
		if ok != c.ok || (ok && v["rank"] != c.rank) {
			t.Errorf("%q ~ %q: %v %v", c.tmpl, c.name, v, ok)
		}
	}
	// Digits padded on the right cannot be read back: 3 with "<05" is "30000".
	for _, tmpl := range []string{"r{rank:<05}.p", "r{rank:0<5}.p", "r{rank:1>5}.p"} {
		tm := MustParse(tmpl)
		name, err := tm.Render(Vars{"rank": 3})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := tm.Match(name)
		if _, has := v["rank"]; !ok || has {
			t.Errorf("%q ~ %q: %v %v, want a match that recovers no rank", tmpl, name, v, ok)
		}
	}
}
