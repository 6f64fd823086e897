package localrun

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

type writes struct{ got []string }

func (w *writes) Write(p []byte) (int, error) { w.got = append(w.got, string(p)); return len(p), nil }

func TestLineWriterPassesWholeLines(t *testing.T) {
	t.Parallel()
	var w writes
	l := newLineWriter(&w)
	for _, chunk := range []string{`{"a":`, `1}` + "\n" + `{"b"`, `:2}` + "\n", "tail"} {
		n, err := l.Write([]byte(chunk))
		require.NoError(t, err)
		require.Equal(t, len(chunk), n)
	}
	l.flush()
	require.Equal(t, []string{`{"a":1}` + "\n", `{"b":2}` + "\n", "tail\n"}, w.got)
	require.True(t, bytes.HasSuffix([]byte(w.got[len(w.got)-1]), []byte("\n")))
}
