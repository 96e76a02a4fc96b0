package leader

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/memsnap/memsnap/coordinator/window"
	"github.com/memsnap/memsnap/internal/store"
	"github.com/memsnap/memsnap/merge"
	"github.com/memsnap/memsnap/merge/publish"
)

// TestOtherCompleterDecides: a leader completing an answer whose claim another
// leader made with other settings never ends the window on its own: once the
// other's manifest is whole, that is how the window ended; while it is pending,
// it tries again.
func TestOtherCompleterDecides(t *testing.T) {
	st, err := store.OpenDir(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	const key = "run/torch_memory_traces/window3/merged.manifest.json"
	put := func(m publish.Manifest) {
		b, _ := json.Marshal(m)
		if _, err := st.Put(context.Background(), key, bytes.NewReader(b), store.PutOptions{Overwrite: true}); err != nil {
			t.Fatal(err)
		}
	}
	l := &Leader{st: st}
	m := window.New(window.Config{ID: 3, World: 2, Asked: map[int]int64{0: -1, 1: -1}})
	m.Phase = window.Answered
	w := newWin(m, "request", nil, key)
	other := fmt.Errorf("%w: another leader's claim", merge.ErrOtherInputs)

	put(publish.Manifest{Version: 1, WorldSize: 2, RanksMerged: []int{0, 1}, Outputs: map[string]publish.Object{}, Pending: []string{"pickle", "pb"}})
	if ev := l.publicationOf(context.Background(), w, nil, other); !ev.Retryable || ev.Held != nil {
		t.Fatalf("while the other's manifest is pending: %+v", ev)
	}
	put(publish.Manifest{Version: 1, WorldSize: 2, RanksMerged: []int{0, 1}, Outputs: map[string]publish.Object{}})
	if ev := l.publicationOf(context.Background(), w, nil, other); ev.Held == nil || ev.Held.Pending || ev.Held.Failed || ev.Err != "" {
		t.Fatalf("once the other's manifest is whole: %+v", ev)
	}
}
