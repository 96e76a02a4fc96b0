package rankagent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/memsnap/memsnap/naming"
)

// Identity is who a rank is in its job.
type Identity struct {
	RunName        string
	Rank           int
	LocalRank      int
	NodeRank       int
	WorldSize      int
	LocalWorldSize int
	Launcher       string // torchrun, slurm, mpi, flags
}

// IdentityFromEnv reads the launcher's environment: torchrun (RANK, LOCAL_RANK,
// WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RUN_ID), SLURM
// (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NODEID, SLURM_JOB_ID), Open MPI
// (OMPI_COMM_WORLD_*) or a Kubernetes indexed Job (JOB_COMPLETION_INDEX, and
// WORLD_SIZE when set: else the world size is 0 here, and ResolveIdentity reads
// the Job's). It returns ok=false when none is set.
func IdentityFromEnv(getenv func(string) string) (Identity, bool, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var id Identity
	r := envReader{getenv: getenv}
	switch {
	case getenv("RANK") != "" && getenv("WORLD_SIZE") != "":
		id.Launcher = "torchrun"
		node := "GROUP_RANK"
		if getenv(node) == "" {
			node = "NODE_RANK"
		}
		r.ranks(&id, "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", node)
		id.RunName = getenv("TORCHELASTIC_RUN_ID")
	case getenv("SLURM_PROCID") != "":
		id.Launcher = "slurm"
		r.ranks(&id, "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "", "SLURM_NODEID")
		id.LocalWorldSize = slurmTasksPerNode(getenv("SLURM_NTASKS_PER_NODE"), getenv("SLURM_TASKS_PER_NODE"))
		id.RunName = getenv("SLURM_JOB_ID")
	case getenv("OMPI_COMM_WORLD_RANK") != "":
		id.Launcher = "mpi"
		r.ranks(&id, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_NODE_RANK")
		id.RunName = mpiJobID(getenv)
	case getenv("JOB_COMPLETION_INDEX") != "":
		// a Kubernetes indexed Job: one pod per rank, the pod's index its rank;
		// without WORLD_SIZE, ResolveIdentity reads the Job's completions
		id.Launcher = "kubernetes"
		r.int(&id.Rank, "JOB_COMPLETION_INDEX", 0)
		r.int(&id.WorldSize, "WORLD_SIZE", 0)
		id.NodeRank, id.LocalRank, id.LocalWorldSize = id.Rank, 0, 1
	default:
		return id, false, nil
	}
	if r.err != nil {
		return id, true, r.err
	}
	if v := firstEnv(getenv, "MEMSNAP_RUN_NAME", "COMPOSER_RUN_NAME", "RUN_NAME"); v != "" {
		id.RunName = v
	}
	chk := id
	if chk.RunName == "" {
		chk.RunName = "memsnap" // the default, set later
	}
	if chk.WorldSize == 0 && id.Launcher == "kubernetes" {
		chk.WorldSize = chk.Rank + 1 // the Job's, read later
	}
	return id, true, chk.Check()
}

// envReader reads a launcher's numbers from the environment; the first error
// stays in err, and what follows it is not read.
type envReader struct {
	getenv func(string) string
	err    error
}

// int sets *dst to the variable name's value, dflt when it is unset or blank.
func (r *envReader) int(dst *int, name string, dflt int) {
	if r.err != nil {
		return
	}
	v := strings.TrimSpace(r.getenv(name))
	if v == "" {
		*dst = dflt
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		r.err = fmt.Errorf("rankagent: %s=%q is not a non-negative integer", name, v)
		return
	}
	*dst = n
}

// ranks reads id's rank, local rank, world size, local world size and node rank,
// in that order, from the variables named; "" leaves a field as it is.
func (r *envReader) ranks(id *Identity, rank, localRank, world, localWorld, node string) {
	for _, f := range []struct {
		dst  *int
		name string
		dflt int
	}{{&id.Rank, rank, 0}, {&id.LocalRank, localRank, 0}, {&id.WorldSize, world, 1}, {&id.LocalWorldSize, localWorld, 1}, {&id.NodeRank, node, 0}} {
		if f.name != "" {
			r.int(f.dst, f.name, f.dflt)
		}
	}
}

// readJobCompletions reads a Kubernetes Job's size (tests stand in for the API).
var readJobCompletions = jobCompletions

// mpiJobID is an Open MPI job's id, so two jobs writing to one store get run
// names of their own: PMIx's namespace (Open MPI 5), the job id (Open MPI 4), or
// the job family of the head node's URI, made safe for a key and a label.
func mpiJobID(getenv func(string) string) string {
	id := firstEnv(getenv, "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid")
	if id == "" {
		if uri := firstEnv(getenv, "OMPI_MCA_orte_hnp_uri", "OMPI_MCA_prte_hnp_uri"); uri != "" {
			id, _, _ = strings.Cut(uri, ";")
		}
	}
	if id == "" {
		return ""
	}
	id = strings.Trim(unsafeChars.ReplaceAllString(id, "-"), "-.")
	if len(id) > 64 {
		id = id[:64]
	}
	return "mpi-" + id
}

func firstEnv(getenv func(string) string, names ...string) string {
	for _, n := range names {
		if v := getenv(n); v != "" {
			return v
		}
	}
	return ""
}

var slurmCount = regexp.MustCompile(`^(\d+)`)

func slurmTasksPerNode(vals ...string) int {
	for _, v := range vals {
		if m := slurmCount.FindStringSubmatch(v); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
	}
	return 1
}

// Check refuses an inconsistent identity.
func (id Identity) Check() error {
	if err := naming.CheckRunName(id.RunName); err != nil {
		return fmt.Errorf("rankagent: %w", err)
	}
	switch {
	case id.WorldSize < 1:
		return fmt.Errorf("rankagent: world size %d", id.WorldSize)
	case id.Rank >= id.WorldSize:
		return fmt.Errorf("rankagent: rank %d is outside world size %d", id.Rank, id.WorldSize)
	case id.LocalWorldSize > 0 && id.LocalRank >= id.LocalWorldSize:
		return fmt.Errorf("rankagent: local rank %d is outside local world size %d", id.LocalRank, id.LocalWorldSize)
	}
	return nil
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// DefaultSocketPath is where the agent listens for its trainer, and where the hook
// looks when MEMSNAP_SOCKET is not set: one socket per run and local rank, inside a
// folder only the user can enter. The hook computes the same path.
func DefaultSocketPath(runName string, localRank int) string {
	base := os.Getenv("XDG_RUNTIME_DIR")
	if base == "" {
		base = os.TempDir()
	}
	run := unsafeChars.ReplaceAllString(runName, "_")
	if run == "" {
		run = "default"
	}
	if len(run) > 40 {
		run = run[:40]
	}
	return filepath.Join(base, fmt.Sprintf("memsnap-%d", os.Getuid()), fmt.Sprintf("%s.%d.sock", run, localRank))
}

// Overrides are identity fields given on the command line; negative ints and empty
// strings leave the launcher's values.
type Overrides struct {
	RunName                                          string
	Rank, LocalRank, NodeRank, WorldSize, LocalWorld int
}

// ResolveIdentity takes the launcher's identity from the environment (or a single
// rank when there is no launcher) and applies the overrides; ctx bounds reading
// a Kubernetes Job's size.
func ResolveIdentity(ctx context.Context, getenv func(string) string, o Overrides) (Identity, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	id, found, err := IdentityFromEnv(getenv)
	if err != nil {
		return id, err
	}
	if !found {
		id = Identity{WorldSize: 1, LocalWorldSize: 1, Launcher: "flags", RunName: getenv("MEMSNAP_RUN_NAME")}
	}
	if id.Launcher == "kubernetes" && id.WorldSize == 0 && o.WorldSize < 0 {
		n, err := readJobCompletions(ctx, getenv)
		if err != nil {
			return id, fmt.Errorf("rankagent: WORLD_SIZE is not set, and the world size could not be read from the Kubernetes Job: %w (set WORLD_SIZE or --world-size, or let the pod's service account get its Job)", err)
		}
		id.WorldSize = n
	}
	for _, f := range []struct {
		v   int
		dst *int
	}{{o.Rank, &id.Rank}, {o.LocalRank, &id.LocalRank}, {o.NodeRank, &id.NodeRank}, {o.WorldSize, &id.WorldSize}, {o.LocalWorld, &id.LocalWorldSize}} {
		if f.v >= 0 {
			*f.dst = f.v
		}
	}
	if o.RunName != "" {
		id.RunName = o.RunName
	}
	if id.RunName == "" {
		id.RunName = "memsnap"
	}
	return id, id.Check()
}

// DefaultSpool is the spool folder beside Composer's local folder: folder (a
// template such as "{run_name}/torch_traces") rendered for id, then
// ".memsnap-spool-rank<rank>".
func DefaultSpool(folder string, id Identity) (string, error) {
	t, err := naming.Parse(folder)
	if err != nil {
		return "", err
	}
	f, err := t.Render(naming.Vars{"run_name": id.RunName, "rank": id.Rank, "local_rank": id.LocalRank, "node_rank": id.NodeRank,
		"world_size": id.WorldSize, "local_world_size": max(id.LocalWorldSize, 1)})
	if err != nil {
		return "", err
	}
	return filepath.Join(f, fmt.Sprintf(".memsnap-spool-rank%d", id.Rank)), nil
}
