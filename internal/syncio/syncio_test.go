package syncio

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

func TestWriter(t *testing.T) {
	var out bytes.Buffer
	for _, w := range []*Writer{{}, {W: &out}} {
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 100 {
					w.Write([]byte("line\n"))
				}
			})
		}
		wg.Wait()
		got := w.String()
		if w.W != nil {
			got = out.String()
		}
		if got != strings.Repeat("line\n", 800) {
			t.Errorf("W %v: %d bytes, want whole lines, 800 of them", w.W != nil, len(got))
		}
	}
}
