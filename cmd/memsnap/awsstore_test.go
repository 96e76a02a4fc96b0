package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/testutil"
)

// isolateAWS clears what the store reads of the AWS tools' settings, points
// HOME at an empty folder and turns instance metadata off: only what the test
// sets is found.
func isolateAWS(t *testing.T) {
	for _, v := range []string{"S3_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "MINIO_ENDPOINT", "AWS_REGION",
		"AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "MINIO_ACCESS_KEY",
		"MINIO_SECRET_KEY", "MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE",
		"AWS_CONFIG_FILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
		"AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CA_BUNDLE", "SSL_CERT_FILE"} {
		t.Setenv(v, "")
	}
	t.Setenv("HOME", t.TempDir())
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
}

// TestStoreSettingsAWS: every command that opens a store takes the same S3
// settings, from flags (--profile, --ca-bundle) or the AWS tools' variables,
// against a MinIO serving TLS with a certificate authority of the test's own
// whose endpoint only AWS_ENDPOINT_URL names; with no credentials anywhere they
// say where they looked.
func TestStoreSettingsAWS(t *testing.T) {
	files := testutil.NewTLSFiles(t)
	m := testutil.StartMinIOTLS(t, files)
	isolateAWS(t)
	creds := filepath.Join(t.TempDir(), "credentials")
	text := "[default]\naws_access_key_id = " + m.AccessKey + "\naws_secret_access_key = not-the-secret\n\n" +
		"[right]\naws_access_key_id = " + m.AccessKey + "\naws_secret_access_key = " + m.SecretKey + "\n"
	if err := os.WriteFile(creds, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AWS_ENDPOINT_URL", m.Endpoint)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", creds)
	flags := []string{"--profile", "right", "--ca-bundle", files.CAFile}
	run := "s3://" + testutil.BucketName(t) + "/run"
	ddp := filepath.Dir(testutil.Snapshot(t, "ddp4/rank0.5.memory_snapshot.pickle"))
	mustRun := func(want string, args ...string) {
		t.Helper()
		if code, out, errOut := runCLI(t, args...); code != 0 || !strings.Contains(out+errOut, want) {
			t.Fatalf("memsnap %v: exit %d, want %q in:\n%s%s", args, code, want, out, errOut)
		}
	}

	mustRun("", append([]string{"merge", "-q", "--out", run + "/merged", ddp}, flags...)...)
	mustRun("4/4", append([]string{"ls", run}, flags...)...)
	mustRun("", append([]string{"diff", run + "/merged/merged.memsnap.pb"}, flags...)...)
	mustRun("", append([]string{"finish", run}, flags...)...)
	t.Setenv("AWS_PROFILE", "right") // the same, from the environment
	t.Setenv("AWS_CA_BUNDLE", files.CAFile)
	mustRun("sha256 verified", "get", run+"/merged/merged.manifest.json", t.TempDir())

	// the default profile's secret is wrong: refused
	if code, _, errOut := runCLI(t, "ls", "--profile", "default", run); code == 0 || !strings.Contains(errOut, "access denied") {
		t.Errorf("ls --profile default: exit %d, want access denied: %s", code, errOut)
	}
	dir := t.TempDir()
	agent := []string{"agent", "--standalone", "--spool", filepath.Join(dir, "spool"), "--socket", filepath.Join(dir, "s"), "--store", run}
	cmd := memsnapCmd(t, agent...)
	out := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	testutil.Eventually(t, 30*time.Second, "the agent to find its store ready", func() bool {
		return strings.Contains(out.String(), "store ready")
	})

	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "none"))
	t.Setenv("AWS_PROFILE", "")
	for _, args := range [][]string{{"ls", run}, agent} {
		code, out := runProc(t, 30*time.Second, nil, args...)
		if code == 0 || !strings.Contains(out, "no S3 credentials found (looked in: ") || strings.Contains(out, "access denied") {
			t.Errorf("memsnap %s with no credentials: exit %d, want them not found:\n%s", args[0], code, out)
		}
	}
}
