package inbox

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestTruncateCutsOnACharacterBoundaryAndKeepsTextStorable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   string
		n    int
		want string
	}{
		{"short text is unchanged", "héllo", 10, "héllo"},
		{"exact length is unchanged", "héllo", 6, "héllo"},
		{"ASCII cut", "abcdef", 3, "abc..."},
		{"two-byte character across the cut", "aaaaé", 5, "aaaa..."},
		{"three-byte character across the cut", "ab€cd", 3, "ab..."},
		{"four-byte character across the cut", "ab😀cd", 5, "ab..."},
		{"cut right after a character", "ab😀cd", 6, "ab😀..."},
		{"nothing fits", "😀", 2, "..."},
		{"zero length", "abc", 0, "..."},
		{"NUL becomes U+FFFD", "a\x00b", 10, "a\uFFFDb"},
		{"invalid UTF-8 becomes U+FFFD", "a\xffb\xc3", 10, "a\uFFFDb\uFFFD"},
		{"replacement counted before the cut", "\x00\x00\x00", 4, "\uFFFD..."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, truncate(tc.in, tc.n))
		})
	}

	// Every cut of mixed text is storable and at most n bytes before the ellipsis.
	s := strings.Repeat("a\x00é€😀\xff", 20)
	for n := 0; n <= len(s)+1; n++ {
		got := truncate(s, n)
		require.True(t, storableText(got), "n=%d: %q", n, got)
		require.LessOrEqual(t, len(strings.TrimSuffix(got, "...")), n, "n=%d", n)
		require.True(t, utf8.ValidString(got))
	}
}
