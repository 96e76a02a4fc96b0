package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/memsnap/memsnap/internal/testutil"
)

// TestKubernetesManifest: deploy/kubernetes.yaml is what a cluster operator
// accepts: the pod's grace period outlasts the hook's dump and the agent's drain;
// the key is a file from a Secret readable by the pod's group (no environment
// variable the trainer inherits); the pod runs as non-root, without privilege
// escalation or capabilities; the world size is the Job's own (a Role lets the
// pod get that Job, and nothing else); and every flag it passes the agent is one
// the agent has.
func TestKubernetesManifest(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "deploy", "kubernetes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type container struct {
		Name          string
		Command, Args []string
		Env           []struct{ Name, Value string }
		VolumeMounts  []struct {
			Name      string
			MountPath string `yaml:"mountPath"`
		} `yaml:"volumeMounts"`
		SecurityContext struct {
			AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
			Capabilities             struct{ Drop []string }
		} `yaml:"securityContext"`
	}
	type doc struct {
		Kind     string
		Metadata struct{ Name string }
		Rules    []struct {
			APIGroups     []string `yaml:"apiGroups"`
			Resources     []string
			ResourceNames []string `yaml:"resourceNames"`
			Verbs         []string
		}
		Subjects []struct{ Kind, Name string }
		RoleRef  struct{ Kind, Name string } `yaml:"roleRef"`
		Spec     struct {
			Completions int
			Template    struct {
				Spec struct {
					ServiceAccountName            string `yaml:"serviceAccountName"`
					TerminationGracePeriodSeconds int    `yaml:"terminationGracePeriodSeconds"`
					SecurityContext               struct {
						RunAsNonRoot *bool `yaml:"runAsNonRoot"`
						RunAsUser    int   `yaml:"runAsUser"`
						FSGroup      int   `yaml:"fsGroup"`
					} `yaml:"securityContext"`
					Volumes []struct {
						Name   string
						Secret *struct {
							SecretName  string `yaml:"secretName"`
							DefaultMode int    `yaml:"defaultMode"`
						}
					}
					Containers []container
				}
			}
		}
	}
	var docs []doc
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var d doc
		if err := dec.Decode(&d); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, d)
	}
	find := func(kind string) *doc {
		for i := range docs {
			if docs[i].Kind == kind {
				return &docs[i]
			}
		}
		t.Fatalf("no %s in the manifest", kind)
		return nil
	}
	job := find("Job")
	pod := job.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("containers %d", len(pod.Containers))
	}
	c := pod.Containers[0]
	flags := map[string]string{}
	for i, a := range c.Command {
		if a == "--" {
			break
		}
		if strings.HasPrefix(a, "--") && i+1 < len(c.Command) {
			flags[a] = c.Command[i+1]
		}
	}
	// the grace period outlasts the hook's dump (10 s) and the agent's drain
	drain, err := time.ParseDuration(flags["--drain-timeout"])
	if err != nil {
		drain = 2 * time.Minute // the agent's default
	}
	if grace := time.Duration(pod.TerminationGracePeriodSeconds) * time.Second; grace <= drain+10*time.Second {
		t.Errorf("terminationGracePeriodSeconds %v is not longer than the drain (%v) and the hook's dump (10 s)", grace, drain)
	}
	// the key: a file from a Secret, readable by the pod's group at most
	keyFile := flags["--key-file"]
	var keyVolume string
	for _, m := range c.VolumeMounts {
		if m.MountPath != "" && strings.HasPrefix(keyFile, m.MountPath+"/") {
			keyVolume = m.Name
		}
	}
	ok := false
	for _, v := range pod.Volumes {
		if v.Name == keyVolume && v.Secret != nil && v.Secret.DefaultMode&0o037 == 0 && v.Secret.DefaultMode&0o040 != 0 {
			ok = true
		}
	}
	if keyFile == "" || !ok || pod.SecurityContext.FSGroup == 0 {
		t.Errorf("the key file %q is not a Secret's file readable by the pod's group (volume %q, fsGroup %d)", keyFile, keyVolume, pod.SecurityContext.FSGroup)
	}
	for _, e := range c.Env {
		if e.Name == "MEMSNAP_KEY" || e.Name == "WORLD_SIZE" {
			t.Errorf("the manifest sets %s", e.Name)
		}
	}
	// non-root, no privilege escalation, no capabilities
	sc := c.SecurityContext
	if p := pod.SecurityContext.RunAsNonRoot; p == nil || !*p || pod.SecurityContext.RunAsUser == 0 ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("security context: pod %+v, container %+v", pod.SecurityContext, sc)
	}
	// the world size is the Job's: its service account may get that Job
	if job.Spec.Completions < 1 || pod.ServiceAccountName == "" {
		t.Fatalf("completions %d, service account %q", job.Spec.Completions, pod.ServiceAccountName)
	}
	role, binding := find("Role"), find("RoleBinding")
	if find("ServiceAccount").Metadata.Name != pod.ServiceAccountName || binding.RoleRef.Name != role.Metadata.Name ||
		len(binding.Subjects) != 1 || binding.Subjects[0].Name != pod.ServiceAccountName {
		t.Errorf("the role is not bound to the pod's service account %q", pod.ServiceAccountName)
	}
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Verbs, []string{"get"}) || !slices.Equal(role.Rules[0].Resources, []string{"jobs"}) ||
		!slices.Equal(role.Rules[0].ResourceNames, []string{job.Metadata.Name}) {
		t.Errorf("the role grants %+v, want get on job %s alone", role.Rules, job.Metadata.Name)
	}
	// every flag is the agent's
	_, _, help := runCLI(t, "agent", "--help")
	for f := range flags {
		if !regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(f) + `\b`).MatchString(help) {
			t.Errorf("the agent has no flag %s", f)
		}
	}
	for _, f := range []string{"--no-schedule"} {
		if !slices.Contains(c.Command, f) {
			t.Errorf("no %s", f)
		}
	}
	if c.Args[0] != "python" {
		t.Errorf("the trainer %v", c.Args)
	}
}
