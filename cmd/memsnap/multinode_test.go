package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/merge/sidecar"
)

// TestClocksMeasuredBeforeTheFirstWindow: a window asked for as soon as the
// cluster formed carries every rank's measured clock offset (each agent measures
// right after it joins and whenever the leader changes, not only every 30 s).
func TestClocksMeasuredBeforeTheFirstWindow(t *testing.T) {
	dir := t.TempDir()
	pc := startProcs(t, 3, procOpts{storeArgs: []string{"--store", dir}})
	c := pc.client(3)
	res := ask(t, c, 2, time.Minute, nil)
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 3 {
		t.Fatalf("result %+v", res)
	}
	m := manifestAt(t, dir, pc.run, res.Window)
	for _, in := range m.Inputs {
		b, err := os.ReadFile(filepath.Join(dir, sidecar.MetaName(in.Source)))
		if err != nil {
			t.Fatal(err)
		}
		meta, err := sidecar.ParseRankMeta(b)
		if err != nil || meta.ClockOffsetUS == nil || meta.ClockRTTUS == nil {
			t.Fatalf("rank %d's sidecar carries no measured clock offset: %v %+v", in.Rank, err, meta)
		}
	}
	if len(m.ClockOffsetsUS) != 3 {
		t.Fatalf("the manifest's clock offsets: %v", m.ClockOffsetsUS)
	}
}

// TestJoinThroughMasterAddr: agents launched as torchrun launches them (no
// --join: MASTER_ADDR names the head host) with a base --gossip-port: local rank
// L listens on base+L, and the head host is dialled at base+0 ... base+2, so the
// cluster forms on the given ports.
func TestJoinThroughMasterAddr(t *testing.T) {
	dir := t.TempDir()
	pc := startProcs(t, 3, procOpts{storeArgs: []string{"--store", dir}, masterAddr: "127.0.0.1"})
	c := pc.client(3)
	res := ask(t, c, 2, time.Minute, nil)
	if res.State != pb.Outcome_OUTCOME_PUBLISHED || len(res.Ranks) != 3 {
		t.Fatalf("result %+v", res)
	}
}
