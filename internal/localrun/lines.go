package localrun

import (
	"bytes"
	"io"
	"sync"
)

// lineWriter passes whole lines to w, one Write per line or run of lines, so that the output of
// several emulator instances sharing one log never interleaves inside a line (a reader of the
// log, such as the demo collecting spans from JSON lines, can trust each line). A process's
// stdout and stderr share one lineWriter: exec then copies them from one goroutine.
type lineWriter struct {
	mu      sync.Mutex
	w       io.Writer
	pending []byte
}

func newLineWriter(w io.Writer) *lineWriter { return &lineWriter{w: w} }

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = append(l.pending, p...)
	if i := bytes.LastIndexByte(l.pending, '\n'); i >= 0 {
		_, err := l.w.Write(l.pending[:i+1])
		l.pending = append(l.pending[:0], l.pending[i+1:]...)
		if err != nil {
			return len(p), err
		}
	}
	return len(p), nil
}

// flush writes what is left of an unfinished last line.
func (l *lineWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.pending) > 0 {
		_, _ = l.w.Write(append(l.pending, '\n'))
		l.pending = nil
	}
}
