package render

import (
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/memsnap/memsnap/internal/pb"
	"github.com/memsnap/memsnap/internal/testutil"
	"github.com/memsnap/memsnap/merge/sidecar"
)

func timelineBytes(t testing.TB, tl *pb.Timeline) []byte {
	b, err := proto.Marshal(tl)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestHostileTimelines: a .memsnap.pb that names impossible ranks or world sizes is
// refused with an error, never a panic or an allocation it cannot justify.
func TestHostileTimelines(t *testing.T) {
	cases := map[string]*pb.Timeline{
		"world -1":        {Version: 1, WorldSize: -1},
		"world 2^31-1":    {Version: 1, WorldSize: 1<<31 - 1},
		"rank -3":         {Version: 1, Ranks: []*pb.RankTimeline{{Rank: -3}}},
		"rank 2^31-1":     {Version: 1, Ranks: []*pb.RankTimeline{{Rank: 1<<31 - 1}}},
		"rank past world": {Version: 1, WorldSize: 2, Ranks: []*pb.RankTimeline{{Rank: 2}}},
		"rank twice":      {Version: 1, Ranks: []*pb.RankTimeline{{Rank: 1}, {Rank: 1}}},
		"missing -1":      {Version: 1, MissingRanks: []int32{-1}},
		"frame index":     {Version: 1, Ranks: []*pb.RankTimeline{{Rank: 0, Events: []*pb.Event{{Frames: []uint32{7}}}}}},
	}
	for name, tl := range cases {
		t.Run(name, func(t *testing.T) {
			b := timelineBytes(t, tl)
			if _, err := ReadTimeline(b); err == nil {
				t.Fatalf("%d bytes accepted", len(b))
			}
			if _, err := RanksFromPB(b, "x"); err == nil {
				t.Fatal("RanksFromPB accepted it")
			}
		})
	}
}

func FuzzReadTimeline(f *testing.F) {
	f.Add(timelineBytes(f, &pb.Timeline{Version: 1, WorldSize: 2, Ranks: []*pb.RankTimeline{{Rank: 1, Events: []*pb.Event{{Action: pb.Action_ALLOC, Size: 8, Frames: []uint32{0}}}}},
		Strings: []string{"", "f"}, Frames: []*pb.Frame{{Name: 1, Filename: 1}}}))
	f.Add(timelineBytes(f, &pb.Timeline{Version: 1, WorldSize: -1}))
	if b, err := os.ReadFile(filepath.Join(testutil.RepoRoot(f), "testdata", "seeds", "merged-small.memsnap.pb")); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tl, err := ReadTimeline(b)
		if err != nil {
			return
		}
		s := TimelineSnapshot(tl)
		if len(s.DeviceTraces) > sidecar.MaxRanks {
			t.Fatalf("%d device traces from %d bytes", len(s.DeviceTraces), len(b))
		}
		s.ComputeFigures()
		if _, err := RanksFromPB(b, "fuzz"); err != nil {
			t.Fatalf("ReadTimeline accepted what RanksFromPB refuses: %v", err)
		}
	})
}
