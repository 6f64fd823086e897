package outbox

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
	"unicode/utf8"
)

// The relay publishes payload::text, PostgreSQL's rendering of the stored jsonb, not the bytes the
// caller wrote: whitespace is dropped, ", " and ": " are added, object keys are sorted and
// deduplicated, strings are re-escaped and numbers are printed in full. renderJSONB computes that
// rendering in Go, byte for byte as PostgreSQL 15 prints it, so that Write can check what will
// really be published. Each rule below names the PostgreSQL 15 function it mirrors.

// MaxNumberDigits is the most digits sluice accepts on either side of the decimal point of a
// number in a payload, counted as PostgreSQL prints it. jsonb keeps numbers as numeric and prints
// every digit without an exponent, so the 8 bytes 1e131071 are published as 131,072 characters and
// 0e-16383 as 16,385: a payload's published size would be unbounded by its written size. A number
// that needs more digits than this is refused at Write, although PostgreSQL would store it; send
// it as a JSON string instead.
const MaxNumberDigits = 100

// MaxNestingDepth is the deepest nesting of arrays and objects sluice accepts in a payload
// ([] is depth 1, [[]] depth 2). PostgreSQL parses JSON by recursion and refuses a document once
// its stack reaches max_stack_depth; with the default 2MB, PostgreSQL 15 accepts about 14,500
// nested arrays or 13,000 nested objects, fewer inside functions or with a smaller setting. This
// bound keeps every accepted payload far below that, so that acceptance does not depend on the
// server's settings.
const MaxNestingDepth = 1000

// PostgreSQL 15's limits for a numeric value, from src/backend/utils/adt/numeric.c.
const (
	// pgNumericWeightMax is NUMERIC_WEIGHT_MAX (PG_INT16_MAX): the largest weight, in base-10000
	// digits, of the first non-zero digit, so at most (32767+1)*4 = 131,072 decimal digits before
	// the point. make_result_opt_error refuses more: "value overflows numeric format".
	pgNumericWeightMax = 32767
	// pgNumericWeightMin is the int16 floor of the stored weight (unreachable from text input,
	// since the display scale limit bites first; kept so the check mirrors make_result_opt_error).
	pgNumericWeightMin = -32768
	// pgNumericDscaleMax is NUMERIC_DSCALE_MAX (NUMERIC_DSCALE_MASK, 0x3FFF): the most digits after
	// the point. make_result_opt_error refuses more: "value overflows numeric format".
	pgNumericDscaleMax = 16383
	// pgNumericExponentLimit is INT_MAX/2: set_var_from_str refuses an exponent >= it or <= -it,
	// even for zero ("value overflows numeric format").
	pgNumericExponentLimit = 1<<31/2 - 1
	// pgDecDigits is DEC_DIGITS, decimal digits per base-10000 digit.
	pgDecDigits = 4
	// pgMaxAllocSize is MaxAllocSize + 1 (src/include/utils/memutils.h): no text value, and so
	// no jsonb input, reaches 1 GB. The check also keeps offsets within int32.
	pgMaxAllocSize = 1 << 30
)

// jsonbError says why PostgreSQL would refuse a payload as jsonb, or why sluice refuses it.
type jsonbError struct {
	// Offset is the byte offset in the payload where the problem is.
	Offset int
	// Problem is the complete explanation, e.g. `contains \u0000 at byte 7, which PostgreSQL jsonb
	// refuses`; it reads after "Payload: " in a ValidationError.
	Problem string
	// SluiceRule is true when the refusal comes from sluice's own bounds (MaxNumberDigits,
	// MaxNestingDepth), not from PostgreSQL. PostgreSQL would store such a payload, except one
	// nested so deep (over 13,000 levels) that it also exceeds PostgreSQL's stack limit.
	SluiceRule bool
}

// Error returns the problem.
func (e *jsonbError) Error() string { return e.Problem }

// renderJSONB returns the bytes PostgreSQL prints for payload::jsonb::text, or a *jsonbError
// saying why PostgreSQL would refuse the input or why sluice refuses it. The result is payload
// itself when payload is already in PostgreSQL's form; callers must not modify either.
//
// It reads the payload once into a small tree (no reflection, no interface values), reusing
// pooled buffers; only objects whose keys are out of order are sorted, and a payload that is
// already canonical is returned without being printed again.
func renderJSONB(payload []byte) ([]byte, error) {
	if len(payload) >= pgMaxAllocSize {
		return nil, &jsonbError{Offset: 0, Problem: fmt.Sprintf("is %d bytes, above the 1 GB PostgreSQL allows for a value", len(payload))}
	}
	r := jsonbRendererPool.Get().(*jsonbRenderer)
	defer r.release()
	r.reset(payload)
	root, err := r.parseDocument()
	if err != nil {
		return nil, err
	}
	if r.canonical && !r.hasLongNumber {
		return payload, nil
	}
	out := make([]byte, 0, len(payload)+len(payload)/4+8)
	return r.emit(out, root)
}

// jsonbKind is the type of a jsonbNode.
type jsonbKind uint8

const (
	jsonbNull jsonbKind = iota
	jsonbTrue
	jsonbFalse
	jsonbNumber
	jsonbString
	jsonbArray
	jsonbObject
)

// jsonbSpan is a byte range of the renderer's input, or of its arena when off >= len(input).
type jsonbSpan struct{ off, end int32 }

// jsonbNode is one value of the parsed document. Nodes are numbered in document order.
type jsonbNode struct {
	kind jsonbKind
	// plain: a string (text) has no byte escape_json would escape, so it prints between quotes.
	plain bool
	// keyPlain: the same for the key of an object member.
	keyPlain bool
	// tooLong: a number printed with more than MaxNumberDigits on one side of the point; an error
	// if it is printed (a value replaced by a later duplicate key is not).
	tooLong bool
	// text: a string's decoded bytes; a number's printed form (its token when tooLong).
	text jsonbSpan
	// key: an object member's decoded key.
	key jsonbSpan
	// first, count: a container's children are order[first : first+count], in output order.
	first, count int32
	// off: the value's byte offset in the input.
	off int32
}

// jsonbRenderer holds the state of one renderJSONB call; its buffers are pooled.
type jsonbRenderer struct {
	in    []byte
	pos   int
	arena []byte      // decoded strings with escapes, re-printed numbers
	nodes []jsonbNode // every value, in document order
	stack []int32     // children of the containers being parsed
	order []int32     // children of finished containers, in output order
	depth int
	// canonical: the input so far is exactly PostgreSQL's rendering of itself.
	canonical bool
	// hasLongNumber: some number breaks MaxNumberDigits (printing reports it if it is printed).
	hasLongNumber bool
}

var jsonbRendererPool = sync.Pool{New: func() any { return new(jsonbRenderer) }}

func (r *jsonbRenderer) reset(in []byte) {
	r.in, r.pos, r.depth = in, 0, 0
	r.arena, r.nodes, r.stack, r.order = r.arena[:0], r.nodes[:0], r.stack[:0], r.order[:0]
	r.canonical, r.hasLongNumber = true, false
}

// release returns r to the pool, unless a huge payload grew its buffers.
func (r *jsonbRenderer) release() {
	r.in = nil
	if cap(r.arena) > 1<<20 || cap(r.nodes) > 1<<16 || cap(r.order) > 1<<16 || cap(r.stack) > 1<<16 {
		return
	}
	jsonbRendererPool.Put(r)
}

func (r *jsonbRenderer) bytes(s jsonbSpan) []byte {
	if n := int32(len(r.in)); s.off >= n {
		return r.arena[s.off-n : s.end-n]
	}
	return r.in[s.off:s.end]
}

// arenaPos is the span offset of the arena's next byte.
func (r *jsonbRenderer) arenaPos() int32 { return int32(len(r.in) + len(r.arena)) }

func (r *jsonbRenderer) fail(off int, format string, args ...any) error {
	return &jsonbError{Offset: off, Problem: fmt.Sprintf(format, args...)}
}

// syntaxError reports input PostgreSQL's JSON parser refuses (json_lex, parse_object, ...).
func (r *jsonbRenderer) syntaxError(off int, what string) error {
	return r.fail(off, "is not valid JSON: %s at byte %d", what, off)
}

// unexpected reports the byte at off where something else was expected.
func (r *jsonbRenderer) unexpected(off int, expected string) error {
	if off >= len(r.in) {
		return r.syntaxError(off, "the input ends where "+expected+" was expected")
	}
	c := r.in[off]
	switch {
	case c == 0:
		return r.fail(off, "contains a NUL byte at byte %d, which PostgreSQL text refuses", off)
	case c >= utf8.RuneSelf:
		if ru, size := utf8.DecodeRune(r.in[off:]); ru == utf8.RuneError && size <= 1 {
			return r.fail(off, "is not valid UTF-8 at byte %d, which PostgreSQL refuses", off)
		}
		return r.syntaxError(off, fmt.Sprintf("unexpected %q where %s was expected", r.word(off), expected))
	case isJSONAlnum(c):
		return r.syntaxError(off, fmt.Sprintf("unexpected %q where %s was expected", r.word(off), expected))
	case c < 0x20 || c == 0x7f:
		return r.syntaxError(off, fmt.Sprintf("unexpected byte 0x%02x where %s was expected", c, expected))
	}
	return r.syntaxError(off, fmt.Sprintf("unexpected %q where %s was expected", string(rune(c)), expected))
}

// word returns the alphanumeric run at off (as json_lex reports it), cut for messages.
func (r *jsonbRenderer) word(off int) string {
	end := off
	for end < len(r.in) && isJSONAlnum(r.in[end]) {
		end++
	}
	return clip(r.in[off:end])
}

// clip shortens b for an error message.
func clip(b []byte) string {
	const limit = 40
	if len(b) <= limit {
		return string(b)
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(b[cut]) {
		cut--
	}
	return string(b[:cut]) + "..."
}

// isJSONAlnum mirrors JSON_ALPHANUMERIC_CHAR in src/common/jsonapi.c: json_lex reads a run of
// these as one token, so "truex", "1x" and "01" are invalid tokens, not two tokens.
func isJSONAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c >= 0x80
}

// skipSpace skips what json_lex skips between tokens: space, tab, newline and carriage return
// (not form feed or vertical tab). PostgreSQL prints exactly one space after ',' and ':' and none
// elsewhere; canonical says which of the two is expected here.
func (r *jsonbRenderer) skipSpace(oneSpace bool) {
	if r.pos < len(r.in) && r.in[r.pos] > ' ' {
		if oneSpace {
			r.canonical = false
		}
		return
	}
	start := r.pos
	for r.pos < len(r.in) {
		switch r.in[r.pos] {
		case ' ', '\t', '\n', '\r':
			r.pos++
			continue
		}
		break
	}
	if oneSpace {
		if r.pos-start != 1 || r.in[start] != ' ' {
			r.canonical = false
		}
	} else if r.pos != start {
		r.canonical = false
	}
}

// parseDocument mirrors pg_parse_json: one value, anything but whitespace after it is an error.
// A bare scalar is a valid document (jsonb stores it as a raw scalar and prints it alone).
func (r *jsonbRenderer) parseDocument() (int32, error) {
	r.skipSpace(false)
	if r.pos >= len(r.in) {
		return 0, r.fail(0, "is not valid JSON: it is empty or only whitespace")
	}
	root, err := r.parseValue()
	if err != nil {
		return 0, err
	}
	r.skipSpace(false)
	if r.pos < len(r.in) {
		return 0, r.unexpected(r.pos, "the end of the input")
	}
	return root, nil
}

func (r *jsonbRenderer) newNode(kind jsonbKind, off int) int32 {
	r.nodes = append(r.nodes, jsonbNode{kind: kind, off: int32(off)})
	return int32(len(r.nodes) - 1)
}

// parseValue mirrors json_lex's dispatch on a token's first byte.
func (r *jsonbRenderer) parseValue() (int32, error) {
	if r.pos >= len(r.in) {
		return 0, r.unexpected(r.pos, "a value")
	}
	switch c := r.in[r.pos]; {
	case c == '{':
		return r.parseObject()
	case c == '[':
		return r.parseArray()
	case c == '"':
		off := r.pos
		text, plain, err := r.lexString()
		if err != nil {
			return 0, err
		}
		i := r.newNode(jsonbString, off)
		r.nodes[i].text, r.nodes[i].plain = text, plain
		return i, nil
	case c == '-' || '0' <= c && c <= '9':
		return r.parseNumber()
	default:
		off := r.pos
		end := off
		for end < len(r.in) && isJSONAlnum(r.in[end]) {
			end++
		}
		var kind jsonbKind
		switch string(r.in[off:end]) {
		case "true":
			kind = jsonbTrue
		case "false":
			kind = jsonbFalse
		case "null":
			kind = jsonbNull
		default:
			return 0, r.unexpected(off, "a value")
		}
		r.pos = end
		return r.newNode(kind, off), nil
	}
}

// enter counts one more level of nesting; see MaxNestingDepth.
func (r *jsonbRenderer) enter(off int) error {
	r.depth++
	if r.depth > MaxNestingDepth {
		return &jsonbError{Offset: off, SluiceRule: true, Problem: fmt.Sprintf(
			"nests arrays and objects more than %d deep at byte %d; sluice refuses deeper payloads (MaxNestingDepth) to stay clear of PostgreSQL's stack limit",
			MaxNestingDepth, off)}
	}
	return nil
}

// parseArray mirrors parse_array. Elements keep their order; PostgreSQL prints them as
// "[a, b]" (JsonbToCStringWorker), and an empty array as "[]".
func (r *jsonbRenderer) parseArray() (int32, error) {
	off := r.pos
	if err := r.enter(off); err != nil {
		return 0, err
	}
	r.pos++
	node := r.newNode(jsonbArray, off)
	base := len(r.stack)
	r.skipSpace(false)
	if r.pos < len(r.in) && r.in[r.pos] == ']' {
		r.pos++
	} else {
		for {
			child, err := r.parseValue()
			if err != nil {
				return 0, err
			}
			r.stack = append(r.stack, child)
			r.skipSpace(false)
			if r.pos < len(r.in) && r.in[r.pos] == ',' {
				r.pos++
				r.skipSpace(true)
				continue
			}
			if r.pos < len(r.in) && r.in[r.pos] == ']' {
				r.pos++
				break
			}
			return 0, r.unexpected(r.pos, `"," or "]"`)
		}
	}
	r.finish(node, base)
	r.depth--
	return node, nil
}

// parseObject mirrors parse_object and parse_object_field. Members are then sorted and
// deduplicated as jsonb does when it builds the object (uniqueifyJsonbObject); see sortMembers.
// PostgreSQL prints them as {"k": v, "k2": v2} (JsonbToCStringWorker), and an empty object as {}.
func (r *jsonbRenderer) parseObject() (int32, error) {
	off := r.pos
	if err := r.enter(off); err != nil {
		return 0, err
	}
	r.pos++
	node := r.newNode(jsonbObject, off)
	base := len(r.stack)
	r.skipSpace(false)
	if r.pos < len(r.in) && r.in[r.pos] == '}' {
		r.pos++
	} else {
		for {
			if r.pos >= len(r.in) || r.in[r.pos] != '"' {
				return 0, r.unexpected(r.pos, "a string key")
			}
			key, keyPlain, err := r.lexString()
			if err != nil {
				return 0, err
			}
			r.skipSpace(false)
			if r.pos >= len(r.in) || r.in[r.pos] != ':' {
				return 0, r.unexpected(r.pos, `":"`)
			}
			r.pos++
			r.skipSpace(true)
			child, err := r.parseValue()
			if err != nil {
				return 0, err
			}
			r.nodes[child].key, r.nodes[child].keyPlain = key, keyPlain
			r.stack = append(r.stack, child)
			r.skipSpace(false)
			if r.pos < len(r.in) && r.in[r.pos] == ',' {
				r.pos++
				r.skipSpace(true)
				continue
			}
			if r.pos < len(r.in) && r.in[r.pos] == '}' {
				r.pos++
				break
			}
			return 0, r.unexpected(r.pos, `"," or "}"`)
		}
		r.sortMembers(base)
	}
	r.finish(node, base)
	r.depth--
	return node, nil
}

// finish moves the children of node from the parse stack to order.
func (r *jsonbRenderer) finish(node int32, base int) {
	r.nodes[node].first = int32(len(r.order))
	r.nodes[node].count = int32(len(r.stack) - base)
	r.order = append(r.order, r.stack[base:]...)
	r.stack = r.stack[:base]
}

// compareKeys mirrors lengthCompareJsonbString (src/backend/utils/adt/jsonb_util.c): a shorter
// key sorts first, keys of equal length compare bytewise (memcmp on the decoded UTF-8).
func (r *jsonbRenderer) compareKeys(a, b int32) int {
	ka, kb := r.bytes(r.nodes[a].key), r.bytes(r.nodes[b].key)
	if len(ka) != len(kb) {
		if len(ka) < len(kb) {
			return -1
		}
		return 1
	}
	return bytes.Compare(ka, kb)
}

// sortMembers orders the members on stack[base:] as uniqueifyJsonbObject does: sorted with
// lengthCompareJsonbPair, which puts the later of two equal keys first, then each run of equal
// keys reduced to its first entry, so the LAST value written for a key wins.
func (r *jsonbRenderer) sortMembers(base int) {
	members := r.stack[base:]
	sorted := true
	for k := 1; k < len(members); k++ {
		if r.compareKeys(members[k-1], members[k]) >= 0 {
			sorted = false
			break
		}
	}
	if sorted {
		return
	}
	r.canonical = false
	slices.SortFunc(members, func(a, b int32) int {
		if c := r.compareKeys(a, b); c != 0 {
			return c
		}
		return int(b - a) // node numbers follow document order: the later member first
	})
	kept := 1
	for k := 1; k < len(members); k++ {
		if r.compareKeys(members[kept-1], members[k]) != 0 {
			members[kept] = members[k]
			kept++
		}
	}
	r.stack = r.stack[:base+kept]
}

// lexString mirrors json_lex_string with de-escaping on (jsonb always de-escapes) and a UTF-8
// server encoding. It returns the decoded bytes and whether they print unescaped between quotes.
// Refused, as PostgreSQL refuses them: a raw byte below 0x20 (it must be escaped), an escape
// other than \" \\ \/ \b \f \n \r \t \uXXXX, \u0000 (text cannot hold NUL), a high surrogate not
// immediately followed by a \u low surrogate, a lone low surrogate, and invalid UTF-8 (refused
// when PostgreSQL receives the text, pg_verify_mbstr).
func (r *jsonbRenderer) lexString() (jsonbSpan, bool, error) {
	in := r.in
	start := r.pos + 1
	i := start
	// Fast path: no escapes, so the decoded string is the raw bytes and prints as written.
	for i < len(in) {
		for i < len(in) && jsonbPlainByte[in[i]] {
			i++
		}
		if i >= len(in) {
			break
		}
		c := in[i]
		switch {
		case c == '"':
			r.pos = i + 1
			return jsonbSpan{int32(start), int32(i)}, true, nil
		case c == '\\':
			return r.lexEscapedString(start, i)
		case c < 0x20:
			return jsonbSpan{}, false, r.controlChar(i)
		case c >= utf8.RuneSelf:
			size, err := r.checkRune(i)
			if err != nil {
				return jsonbSpan{}, false, err
			}
			i += size
		default:
			i++
		}
	}
	return jsonbSpan{}, false, r.syntaxError(r.pos, "unterminated string starting")
}

// jsonbPlainByte marks the ASCII bytes that stand for themselves in a JSON string and that
// escape_json prints as they are: 0x20 to 0x7F except '"' and '\'.
var jsonbPlainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func (r *jsonbRenderer) controlChar(off int) error {
	if r.in[off] == 0 {
		return r.fail(off, "contains a NUL byte at byte %d, which PostgreSQL text refuses", off)
	}
	return r.syntaxError(off, fmt.Sprintf("the control character 0x%02x must be escaped in a string", r.in[off]))
}

// checkRune validates the UTF-8 sequence at off and returns its length.
func (r *jsonbRenderer) checkRune(off int) (int, error) {
	ru, size := utf8.DecodeRune(r.in[off:])
	if ru == utf8.RuneError && size <= 1 {
		return 0, r.fail(off, "is not valid UTF-8 at byte %d, which PostgreSQL refuses", off)
	}
	return size, nil
}

// lexEscapedString decodes a string with escapes into the arena; raw content before the first
// backslash at esc starts at start.
func (r *jsonbRenderer) lexEscapedString(start, esc int) (jsonbSpan, bool, error) {
	in := r.in
	spanStart := r.arenaPos()
	r.arena = append(r.arena, in[start:esc]...)
	hi, hiOff := rune(-1), 0 // a pending high surrogate and its offset
	for i := esc; ; {
		if i >= len(in) {
			return jsonbSpan{}, false, r.syntaxError(r.pos, "unterminated string starting")
		}
		c := in[i]
		if c != '\\' {
			if hi >= 0 {
				return jsonbSpan{}, false, r.loneSurrogate(hiOff, hi)
			}
			switch {
			case c == '"':
				r.pos = i + 1
				return jsonbSpan{spanStart, r.arenaPos()}, false, nil
			case c < 0x20:
				return jsonbSpan{}, false, r.controlChar(i)
			case c >= utf8.RuneSelf:
				size, err := r.checkRune(i)
				if err != nil {
					return jsonbSpan{}, false, err
				}
				r.arena = append(r.arena, in[i:i+size]...)
				i += size
			default:
				r.arena = append(r.arena, c)
				i++
			}
			continue
		}
		if i+1 >= len(in) {
			return jsonbSpan{}, false, r.syntaxError(r.pos, "unterminated string starting")
		}
		e := in[i+1]
		if e != 'u' {
			if hi >= 0 {
				return jsonbSpan{}, false, r.loneSurrogate(hiOff, hi)
			}
			var d byte
			switch e {
			case '"', '\\':
				d = e
			case '/':
				d = '/'
				r.canonical = false // printed as a plain '/'
			case 'b':
				d = '\b'
			case 'f':
				d = '\f'
			case 'n':
				d = '\n'
			case 'r':
				d = '\r'
			case 't':
				d = '\t'
			default:
				return jsonbSpan{}, false, r.syntaxError(i, fmt.Sprintf("invalid escape %q in a string", "\\"+clip(in[i+1:i+1+r.runeLen(i+1)])))
			}
			r.arena = append(r.arena, d)
			i += 2
			continue
		}
		// \uXXXX
		var cp rune
		lower := true
		for k := i + 2; k < i+6; k++ {
			if k >= len(in) {
				return jsonbSpan{}, false, r.syntaxError(r.pos, "unterminated string starting")
			}
			h := in[k]
			switch {
			case '0' <= h && h <= '9':
				cp = cp<<4 | rune(h-'0')
			case 'a' <= h && h <= 'f':
				cp = cp<<4 | rune(h-'a'+10)
			case 'A' <= h && h <= 'F':
				cp = cp<<4 | rune(h-'A'+10)
				lower = false
			default:
				return jsonbSpan{}, false, r.syntaxError(i, fmt.Sprintf(`"\u" must be followed by four hexadecimal digits, found %q`, clip(in[i:min(k+r.runeLen(k), len(in))])))
			}
		}
		switch {
		case 0xD800 <= cp && cp <= 0xDBFF:
			if hi >= 0 {
				return jsonbSpan{}, false, r.loneSurrogate(hiOff, hi)
			}
			hi, hiOff = cp, i
			i += 6
			r.canonical = false
			continue
		case 0xDC00 <= cp && cp <= 0xDFFF:
			if hi < 0 {
				return jsonbSpan{}, false, r.loneSurrogate(i, cp)
			}
			cp = 0x10000 + (hi-0xD800)<<10 + (cp - 0xDC00)
			hi = -1
		case hi >= 0:
			return jsonbSpan{}, false, r.loneSurrogate(hiOff, hi)
		}
		if cp == 0 {
			return jsonbSpan{}, false, r.fail(i, `contains \u0000 at byte %d, which PostgreSQL jsonb refuses (text cannot hold a NUL character)`, i)
		}
		// escape_json prints \u%04x only for control characters without a short escape.
		if !lower || cp >= 0x20 || cp == '\b' || cp == '\f' || cp == '\n' || cp == '\r' || cp == '\t' {
			r.canonical = false
		}
		r.arena = utf8.AppendRune(r.arena, cp)
		i += 6
	}
}

// runeLen is the length of the (possibly invalid) character at off, for messages.
func (r *jsonbRenderer) runeLen(off int) int {
	if off >= len(r.in) {
		return 0
	}
	_, size := utf8.DecodeRune(r.in[off:])
	return size
}

func (r *jsonbRenderer) loneSurrogate(off int, cp rune) error {
	return r.fail(off, `contains the unpaired UTF-16 surrogate \u%04x at byte %d, which PostgreSQL jsonb refuses (a \ud800-\udbff escape must be followed directly by a \udc00-\udfff one)`, cp, off)
}

// numberToken is a number token split as json_lex_number reads it: -?int(.frac)?([eE][+-]?exp)?
type numberToken struct {
	neg        bool
	intDigits  []byte // "0" or a digit string not starting with '0'
	fracDigits []byte // the digits after '.', if any
	exp        int64  // the exponent, saturated far beyond pgNumericExponentLimit
	hasExp     bool
}

// digit returns digit k of intDigits+fracDigits, '0' outside them.
func (n *numberToken) digit(k int64) byte {
	ni := int64(len(n.intDigits))
	switch {
	case k < 0:
		return '0'
	case k < ni:
		return n.intDigits[k]
	case k < ni+int64(len(n.fracDigits)):
		return n.fracDigits[k-ni]
	}
	return '0'
}

// lexNumber mirrors json_lex_number: an optional '-', then "0" or a non-zero digit and more
// digits, an optional '.' with at least one digit, an optional e/E with an optional sign and at
// least one digit; a letter, digit, '_' or non-ASCII byte right after it makes it invalid.
// So 01, +1, .5, 1., 1e, 0x1, NaN and Infinity are refused, as RFC 8259 says.
func lexNumber(in []byte, pos int) (n numberToken, end int, ok bool) {
	i := pos
	if i < len(in) && in[i] == '-' {
		n.neg = true
		i++
	}
	digits := func() int {
		s := i
		for i < len(in) && '0' <= in[i] && in[i] <= '9' {
			i++
		}
		return i - s
	}
	s := i
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case i < len(in) && '1' <= in[i] && in[i] <= '9':
		digits()
	default:
		return n, i, false
	}
	n.intDigits = in[s:i]
	if i < len(in) && in[i] == '.' {
		i++
		s = i
		if digits() == 0 {
			return n, i, false
		}
		n.fracDigits = in[s:i]
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		n.hasExp = true
		i++
		neg := false
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			neg = in[i] == '-'
			i++
		}
		s = i
		if digits() == 0 {
			return n, i, false
		}
		for _, d := range in[s:i] {
			if n.exp < 1<<40 {
				n.exp = n.exp*10 + int64(d-'0')
			}
		}
		if neg {
			n.exp = -n.exp
		}
	}
	if i < len(in) && isJSONAlnum(in[i]) {
		return n, i, false
	}
	return n, i, true
}

// jsonbNumberShape is what numeric_in makes of a number and numeric_out prints.
type jsonbNumberShape struct {
	zero      bool
	first     int64 // index in intDigits+fracDigits of the first non-zero digit
	point     int64 // index in intDigits+fracDigits where the decimal point falls
	dscale    int64 // digits printed after the point
	intDigits int64 // digits printed before the point
	overflow  bool  // numeric_in refuses it: "value overflows numeric format"
}

// shape mirrors set_var_from_str and make_result_opt_error (numeric.c). The display scale is the
// number of digits written after the point minus the exponent, at least 0, so trailing zeros
// count (1.50e1 is 15.0, 0e-5 is 0.00000); leading zeros go, and zero loses its sign. Refused:
// an exponent of INT_MAX/2 or more in size, a first non-zero digit whose base-10000 weight leaves
// int16 (more than 131,072 digits before the point), a display scale above 16383.
func (n *numberToken) shape() jsonbNumberShape {
	var s jsonbNumberShape
	if n.exp >= pgNumericExponentLimit || n.exp <= -pgNumericExponentLimit {
		s.overflow = true
		return s
	}
	s.dscale = max(0, int64(len(n.fracDigits))-n.exp)
	s.point = int64(len(n.intDigits)) + n.exp
	total := int64(len(n.intDigits) + len(n.fracDigits))
	s.first = total
	for k := int64(0); k < total; k++ {
		if n.digit(k) != '0' {
			s.first = k
			break
		}
	}
	s.zero = s.first == total
	s.intDigits = 1
	if !s.zero {
		e10 := s.point - 1 - s.first // the power of ten of the first non-zero digit
		weight := e10 / pgDecDigits
		if e10 < 0 && e10%pgDecDigits != 0 {
			weight-- // floor division
		}
		if weight > pgNumericWeightMax || weight < pgNumericWeightMin {
			s.overflow = true
		}
		if s.point > s.first {
			s.intDigits = s.point - s.first
		}
	}
	if s.dscale > pgNumericDscaleMax {
		s.overflow = true
	}
	return s
}

// parseNumber lexes a number, checks it as numeric_in does, and keeps how numeric_out prints it:
// no exponent, every digit (get_str_from_var). A token without an exponent that is not a negative
// zero already prints as written.
func (r *jsonbRenderer) parseNumber() (int32, error) {
	off := r.pos
	n, end, ok := lexNumber(r.in, off)
	if !ok {
		return 0, r.badNumber(off, end)
	}
	r.pos = end
	node := r.newNode(jsonbNumber, off)
	s := n.shape()
	if s.overflow {
		// parse_scalar lexes the next token before it calls numeric_in: a bad token there is
		// what PostgreSQL reports.
		if err := r.nextTokenError(); err != nil {
			return 0, err
		}
		return 0, r.fail(off, "has the number %s at byte %d, which PostgreSQL's numeric refuses (value overflows numeric format: at most %d digits before the decimal point and %d after)",
			clip(r.in[off:end]), off, (pgNumericWeightMax+1)*pgDecDigits, pgNumericDscaleMax)
	}
	if s.intDigits > MaxNumberDigits || s.dscale > MaxNumberDigits {
		r.nodes[node].tooLong, r.hasLongNumber = true, true
		r.nodes[node].text = jsonbSpan{int32(off), int32(end)}
		return node, nil
	}
	if !n.hasExp && !(n.neg && s.zero) {
		r.nodes[node].text = jsonbSpan{int32(off), int32(end)}
		return node, nil
	}
	r.canonical = false
	start := r.arenaPos()
	if n.neg && !s.zero {
		r.arena = append(r.arena, '-')
	}
	if s.zero || s.point <= s.first {
		r.arena = append(r.arena, '0')
	} else {
		for k := s.first; k < s.point; k++ {
			r.arena = append(r.arena, n.digit(k))
		}
	}
	if s.dscale > 0 {
		r.arena = append(r.arena, '.')
		for k := s.point; k < s.point+s.dscale; k++ {
			r.arena = append(r.arena, n.digit(k))
		}
	}
	r.nodes[node].text = jsonbSpan{start, r.arenaPos()}
	return node, nil
}

// badNumber reports the invalid number token at off, which lexNumber read up to end.
func (r *jsonbRenderer) badNumber(off, end int) error {
	for end < len(r.in) && isJSONAlnum(r.in[end]) {
		end++
	}
	return r.syntaxError(off, fmt.Sprintf("invalid number %q", clip(r.in[off:max(end, off+1)])))
}

// nextTokenError returns the error json_lex reports for the token after r.pos, if any.
func (r *jsonbRenderer) nextTokenError() error {
	save, canonical := r.pos, r.canonical
	defer func() { r.pos, r.canonical = save, canonical }()
	r.skipSpace(false)
	if r.pos >= len(r.in) {
		return nil
	}
	switch c := r.in[r.pos]; {
	case c == '{' || c == '}' || c == '[' || c == ']' || c == ',' || c == ':':
		return nil
	case c == '"':
		_, _, err := r.lexString()
		return err
	case c == '-' || '0' <= c && c <= '9':
		if _, end, ok := lexNumber(r.in, r.pos); !ok {
			return r.badNumber(r.pos, end)
		}
		return nil
	default:
		_, err := r.parseValue()
		return err
	}
}

// longNumberError reports a number beyond MaxNumberDigits that would be printed.
func (r *jsonbRenderer) longNumberError(node *jsonbNode) error {
	tok := r.bytes(node.text)
	n, _, _ := lexNumber(tok, 0)
	s := n.shape()
	return &jsonbError{Offset: int(node.off), SluiceRule: true, Problem: fmt.Sprintf(
		"has the number %s at byte %d, which PostgreSQL would print with %d digits before the decimal point and %d after; sluice refuses more than %d on either side (MaxNumberDigits), because jsonb prints numbers in full: send it as a string",
		clip(tok), node.off, s.intDigits, s.dscale, MaxNumberDigits)}
}

// emit appends the rendering of node i, as JsonbToCStringWorker prints it (no indentation).
func (r *jsonbRenderer) emit(out []byte, i int32) ([]byte, error) {
	n := &r.nodes[i]
	var err error
	switch n.kind {
	case jsonbNull:
		out = append(out, "null"...)
	case jsonbTrue:
		out = append(out, "true"...)
	case jsonbFalse:
		out = append(out, "false"...)
	case jsonbNumber:
		if n.tooLong {
			return nil, r.longNumberError(n)
		}
		out = append(out, r.bytes(n.text)...)
	case jsonbString:
		out = r.appendString(out, n.text, n.plain)
	case jsonbArray:
		out = append(out, '[')
		for k, child := range r.order[n.first : n.first+n.count] {
			if k > 0 {
				out = append(out, ", "...)
			}
			if out, err = r.emit(out, child); err != nil {
				return nil, err
			}
		}
		out = append(out, ']')
	case jsonbObject:
		out = append(out, '{')
		for k, child := range r.order[n.first : n.first+n.count] {
			if k > 0 {
				out = append(out, ", "...)
			}
			c := &r.nodes[child]
			out = r.appendString(out, c.key, c.keyPlain)
			out = append(out, ": "...)
			if out, err = r.emit(out, child); err != nil {
				return nil, err
			}
		}
		out = append(out, '}')
	}
	return out, nil
}

// appendString prints a decoded string as escape_json (src/backend/utils/adt/json.c) does:
// \" \\ \b \f \n \r \t, any other byte below 0x20 as \u00xx in lower-case hex, everything else
// (including '/', DEL and non-ASCII) as it is.
func (r *jsonbRenderer) appendString(out []byte, s jsonbSpan, plain bool) []byte {
	b := r.bytes(s)
	out = append(out, '"')
	if plain {
		out = append(out, b...)
		return append(out, '"')
	}
	const hex = "0123456789abcdef"
	last := 0
	for k, c := range b {
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		out = append(out, b[last:k]...)
		switch c {
		case '"':
			out = append(out, `\"`...)
		case '\\':
			out = append(out, `\\`...)
		case '\b':
			out = append(out, `\b`...)
		case '\f':
			out = append(out, `\f`...)
		case '\n':
			out = append(out, `\n`...)
		case '\r':
			out = append(out, `\r`...)
		case '\t':
			out = append(out, `\t`...)
		default:
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
		}
		last = k + 1
	}
	out = append(out, b[last:]...)
	return append(out, '"')
}
