// Package syncio has the one writer that several goroutines share: a process's
// output that its logger and its child write together, or a test's buffer that
// processes write while the test reads it.
package syncio

import (
	"bytes"
	"io"
	"sync"
)

// Writer serialises the writes of several goroutines: to W, or, when W is nil (the
// zero Writer), to a buffer that String returns.
type Writer struct {
	mu  sync.Mutex
	W   io.Writer
	buf bytes.Buffer
}

func (s *Writer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.W == nil {
		return s.buf.Write(p)
	}
	return s.W.Write(p)
}

// String is what was written to the buffer so far ("" when W is set).
func (s *Writer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
