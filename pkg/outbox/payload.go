package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"
)

// maxNestingDepth is the deepest nesting of arrays and objects sluice accepts in a payload
// ([] is depth 1, [[]] depth 2). PostgreSQL's json input parses by recursion and refuses a
// document once its stack reaches max_stack_depth (with the default 2MB, PostgreSQL 15 accepts
// some ten thousand levels, fewer with a smaller setting), and consumers' parsers have limits of
// their own (Go's encoding/json stops at 10,000). This bound keeps every accepted payload far
// below those, so that acceptance does not depend on the server's settings. It is the one rule
// by which Write refuses a payload that PostgreSQL would store.
const maxNestingDepth = 1000

// checkPayload returns why PostgreSQL's json input (in a UTF8 database) would refuse p, or why
// sluice does (maxNestingDepth), or "" when p is stored as it is. PostgreSQL's json type checks
// the JSON grammar (RFC 8259, the same as encoding/json's) and nothing more: it keeps duplicate
// keys, any number however long (1e400, 0e-16383), \u0000 and lone surrogate escapes, which
// jsonb would refuse or rewrite; the database encoding refuses bytes that are not UTF-8.
func checkPayload(p []byte) string {
	if !utf8.Valid(p) {
		return fmt.Sprintf("is not valid UTF-8 (at byte %d), which PostgreSQL refuses", invalidUTF8At(p))
	}
	if depth, at := nesting(p); depth > maxNestingDepth {
		return fmt.Sprintf("nests arrays and objects %d deep at byte %d, above the %d levels sluice accepts", depth, at, maxNestingDepth)
	}
	if json.Valid(p) {
		return ""
	}
	// The error path only: Unmarshal runs the same scanner and says where it stopped.
	var se *json.SyntaxError
	if err := json.Unmarshal(p, new(json.RawMessage)); errors.As(err, &se) {
		return fmt.Sprintf("is not valid JSON: %s (at byte %d)", se.Error(), se.Offset)
	}
	return "is not valid JSON"
}

// invalidUTF8At returns the offset of the first byte of p that is not valid UTF-8.
func invalidUTF8At(p []byte) int {
	for i := 0; i < len(p); {
		r, n := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(p)
}

// nesting returns the deepest nesting of arrays and objects in p, and the offset where it
// first exceeds maxNestingDepth (or where it is deepest). Brackets inside strings do not count;
// p need not be valid JSON.
func nesting(p []byte) (deepest, at int) {
	depth, inString := 0, false
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case inString:
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			if depth > deepest {
				deepest, at = depth, i
				if deepest > maxNestingDepth {
					return deepest, at
				}
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return deepest, at
}
