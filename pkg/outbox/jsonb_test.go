package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
)

// jsonbCase is one input with what PostgreSQL 15 and renderJSONB must make of it. Every case is
// also sent to PostgreSQL, which must agree.
type jsonbCase struct {
	name string
	in   string
	// want is PostgreSQL's payload::jsonb::text when it accepts the input.
	want string
	// err is a substring of renderJSONB's error when the input is refused.
	err string
	// sluice: PostgreSQL accepts the input, only sluice's bounds refuse it.
	sluice bool
}

func nested(open, inner, close string, depth int) string {
	return strings.Repeat(open, depth) + inner + strings.Repeat(close, depth)
}

var jsonbCases = []jsonbCase{
	// Structure and whitespace (JsonbToCStringWorker: ", " and ": ", nothing else).
	{name: "empty object", in: `{}`, want: `{}`},
	{name: "empty array", in: `[]`, want: `[]`},
	{name: "spaced empty object", in: " { \n} ", want: `{}`},
	{name: "spaced empty array", in: "[\t]", want: `[]`},
	{name: "compact object", in: `{"a":1,"b":[1,2]}`, want: `{"a": 1, "b": [1, 2]}`},
	{name: "canonical object", in: `{"a": 1, "b": [1, 2]}`, want: `{"a": 1, "b": [1, 2]}`},
	{name: "all json whitespace", in: "\t\n\r [1 ,\n2\r]\r\n ", want: `[1, 2]`},
	{name: "nested containers", in: `{"a":{"b":{"c":[[],{},[{}]]}}}`, want: `{"a": {"b": {"c": [[], {}, [{}]]}}}`},
	{name: "array of mixed scalars", in: `[null,true,false,"s",0,-1.5]`, want: `[null, true, false, "s", 0, -1.5]`},
	{name: "top-level number", in: `1`, want: `1`},
	{name: "top-level string", in: `"x"`, want: `"x"`},
	{name: "top-level true", in: ` true `, want: `true`},
	{name: "top-level false", in: `false`, want: `false`},
	{name: "top-level null", in: "\nnull\n", want: `null`},
	{name: "nesting at the bound", in: nested("[", "1", "]", MaxNestingDepth), want: nested("[", "1", "]", MaxNestingDepth)},
	{name: "object nesting at the bound", in: nested(`{"a":`, "1", "}", MaxNestingDepth), want: nested(`{"a": `, "1", "}", MaxNestingDepth)},

	// Object keys: sorted shorter first, then bytewise; the last duplicate wins (uniqueifyJsonbObject).
	{name: "keys sorted", in: `{"b":1,"a":2}`, want: `{"a": 2, "b": 1}`},
	{name: "shorter key first", in: `{"aa":1,"b":2}`, want: `{"b": 2, "aa": 1}`},
	{name: "bytewise within a length", in: `{"a":1,"B":2,"_":3}`, want: `{"B": 2, "_": 3, "a": 1}`},
	{name: "empty key first", in: `{"a":1,"":2}`, want: `{"": 2, "a": 1}`},
	{name: "non-ASCII key by UTF-8 bytes", in: `{"é":1,"zz":2,"z":3}`, want: `{"z": 3, "zz": 2, "é": 1}`},
	{name: "duplicate keeps last", in: `{"a":1,"a":2}`, want: `{"a": 2}`},
	{name: "duplicate among others", in: `{"a":1,"b":2,"a":3}`, want: `{"a": 3, "b": 2}`},
	{name: "three duplicates", in: `{"k":1,"k":2,"k":3}`, want: `{"k": 3}`},
	{name: "duplicate container replaced", in: `{"a":{"x":1},"a":[2]}`, want: `{"a": [2]}`},
	{name: "duplicate spelled with an escape", in: `{"\u0061":1,"a":2}`, want: `{"a": 2}`},
	{name: "duplicate escape last", in: `{"a":1,"\u0061":2}`, want: `{"a": 2}`},
	{name: "duplicates in nested object", in: `[{"b":1,"a":2,"b":3}]`, want: `[{"a": 2, "b": 3}]`},
	{name: "escaped key re-escaped", in: `{"a\nb":1,"\/":2}`, want: `{"/": 2, "a\nb": 1}`},
	{name: "key with quote", in: `{"\"":1}`, want: `{"\"": 1}`},

	// Strings: decoded, then printed as escape_json prints them.
	{name: "escaped slash unescaped", in: `"a\/b"`, want: `"a/b"`},
	{name: "raw slash kept", in: `"a/b"`, want: `"a/b"`},
	{name: "short escapes kept", in: `"\b\f\n\r\t\"\\"`, want: `"\b\f\n\r\t\"\\"`},
	{name: "escaped backslash then u0000", in: `{"a":"\\u0000"}`, want: `{"a": "\\u0000"}`},
	{name: "u00e9 decoded", in: `"\u00e9"`, want: `"é"`},
	{name: "upper-case hex decoded", in: `"\u00E9"`, want: `"é"`},
	{name: "surrogate pair decoded", in: `"\ud83d\ude00"`, want: `"😀"`},
	{name: "upper-case surrogate pair", in: `"\uD83D\uDE00"`, want: `"😀"`},
	{name: "highest code point", in: `"\udbff\udfff"`, want: "\"\U0010FFFF\""},
	{name: "raw astral", in: `"😀 𝄞"`, want: `"😀 𝄞"`},
	{name: "control char in lower-case hex", in: `"\u001f"`, want: `"\u001f"`},
	{name: "control char upper-case hex lowered", in: `"\u001F"`, want: `"\u001f"`},
	{name: "u0001", in: `"\u0001"`, want: `"\u0001"`},
	{name: "newline by code", in: `"\u000a"`, want: `"\n"`},
	{name: "backspace by code", in: `"\u0008"`, want: `"\b"`},
	{name: "tab form feed return by code", in: `"\u0009\u000c\u000d"`, want: `"\t\f\r"`},
	{name: "quote by code", in: `"\u0022"`, want: `"\""`},
	{name: "backslash by code", in: `"\u005c"`, want: `"\\"`},
	{name: "slash by code", in: `"\u002f"`, want: `"/"`},
	{name: "DEL stays raw", in: `"\u007f"`, want: "\"\x7f\""},
	{name: "raw DEL", in: "\"\x7f\"", want: "\"\x7f\""},
	{name: "line separator raw", in: `"\u2028"`, want: "\"\u2028\""},
	{name: "noncharacters", in: `"\ufffe\uffff"`, want: "\"\ufffe\uffff\""},
	{name: "empty string", in: `""`, want: `""`},
	{name: "escape then text", in: `"x\ty\u00e9z"`, want: `"x\tyéz"`},

	// Numbers: numeric_in then numeric_out.
	{name: "trailing zeros kept", in: `12.3400`, want: `12.3400`},
	{name: "exponent keeps scale", in: `1.50e1`, want: `15.0`},
	{name: "negative exponent", in: `1e-3`, want: `0.001`},
	{name: "zero with scale", in: `0e-5`, want: `0.00000`},
	{name: "negative zero", in: `-0`, want: `0`},
	{name: "negative zero with scale", in: `-0.0`, want: `0.0`},
	{name: "negative zero exponent", in: `-0.000e2`, want: `0.0`},
	{name: "upper-case exponent plus", in: `1E+2`, want: `100`},
	{name: "exponent", in: `1e2`, want: `100`},
	{name: "exponent zero", in: `1e0`, want: `1`},
	{name: "exponent minus zero", in: `1e-0`, want: `1`},
	{name: "exponent leading zeros", in: `1e+00005`, want: `100000`},
	{name: "fraction shifted", in: `0.1e1`, want: `1`},
	{name: "fraction shifted keeps zero", in: `0.10e1`, want: `1.0`},
	{name: "shift into fraction", in: `123e-2`, want: `1.23`},
	{name: "shift past the point", in: `123e-5`, want: `0.00123`},
	{name: "negative shifted", in: `-1.5e-1`, want: `-0.15`},
	{name: "scale from zeros", in: `100e-2`, want: `1.00`},
	{name: "zero fraction", in: `0.000`, want: `0.000`},
	{name: "leading fraction zeros", in: `0.00012`, want: `0.00012`},
	{name: "leading zeros after exponent", in: `0.0012e2`, want: `0.12`},
	{name: "long integer", in: `-123456789012345678901234567890.123456789`, want: `-123456789012345678901234567890.123456789`},
	{name: "zero with huge exponent", in: `0e1073741822`, want: `0`},
	{name: "zero fraction with huge exponent", in: `0.000e1000000`, want: `0`},
	{name: "100 digits before the point", in: `1e99`, want: "1" + strings.Repeat("0", 99)},
	{name: "100 digits after the point", in: `1e-100`, want: "0." + strings.Repeat("0", 99) + "1"},
	{name: "100 digit integer", in: strings.Repeat("9", 100), want: strings.Repeat("9", 100)},
	{name: "long number in replaced duplicate", in: `{"a":1e200,"a":1}`, want: `{"a": 1}`},
	{name: "numbers in arrays", in: `[1e1,-2.50E-1,0.0e0]`, want: `[10, -0.250, 0.0]`},

	// Numbers sluice refuses: PostgreSQL prints them with more than MaxNumberDigits digits.
	{name: "101 digits before the point", in: `1e100`, err: "101 digits before the decimal point", sluice: true},
	{name: "101 digits after the point", in: `1e-101`, err: "and 101 after", sluice: true},
	{name: "101 digit integer", in: strings.Repeat("9", 101), err: "MaxNumberDigits", sluice: true},
	{name: "101 digit fraction", in: "0." + strings.Repeat("1", 101), err: "MaxNumberDigits", sluice: true},
	{name: "scale 101 from trailing zeros", in: `1.0e-100`, err: "MaxNumberDigits", sluice: true},
	{name: "largest numeric", in: `[1e131071]`, err: "131072 digits before", sluice: true},
	{name: "largest weight by fraction", in: `0.0001e131075`, err: "MaxNumberDigits", sluice: true},
	{name: "largest weight with digits", in: `9.999e131071`, err: "MaxNumberDigits", sluice: true},
	{name: "largest scale", in: `1e-16383`, err: "and 16383 after", sluice: true},
	{name: "zero with largest scale", in: `0e-16383`, err: "and 16383 after", sluice: true},
	{name: "long number kept by duplicate", in: `{"a":1,"a":1e200}`, err: "MaxNumberDigits", sluice: true},

	// Numbers PostgreSQL refuses: "value overflows numeric format" (make_result_opt_error,
	// set_var_from_str).
	{name: "weight overflow", in: `[1e131072]`, err: "value overflows numeric format"},
	{name: "weight overflow by digits", in: `10e131071`, err: "value overflows numeric format"},
	{name: "weight overflow by fraction", in: `0.0001e131076`, err: "value overflows numeric format"},
	{name: "scale overflow", in: `1e-16384`, err: "value overflows numeric format"},
	{name: "zero scale overflow", in: `0e-16384`, err: "value overflows numeric format"},
	{name: "zero scale overflow by digits", in: `0.0e-16383`, err: "value overflows numeric format"},
	{name: "exponent limit on zero", in: `0e1073741823`, err: "value overflows numeric format"},
	{name: "negative exponent limit", in: `0e-1073741823`, err: "value overflows numeric format"},
	{name: "huge exponent", in: `1e99999999999999999999`, err: "value overflows numeric format"},
	{name: "overflow in replaced duplicate", in: `{"a":1e131072,"a":1}`, err: "value overflows numeric format"},
	{name: "overflow before a comma", in: `[1e131072, "\u0000"]`, err: "value overflows numeric format"},
	// parse_scalar lexes the next token before numeric_in sees the number (found by fuzzing).
	{name: "overflow then bad token", in: `1e170000!`, err: "not valid JSON"},
	{name: "overflow then bad string", in: `[1e131072 "\u0000"]`, err: `contains \u0000`},
	{name: "overflow then bad number", in: `[1e131072 01]`, err: "not valid JSON"},
	{name: "overflow then bad word", in: `[1e131072 nul]`, err: "not valid JSON"},
	{name: "overflow then number", in: `[1e131072 1e131072]`, err: "value overflows numeric format"},

	// Invalid JSON (json_lex, json_lex_number, parse_*).
	{name: "empty", in: ``, err: "empty"},
	{name: "only whitespace", in: " \n", err: "empty"},
	{name: "unclosed object", in: `{`, err: "not valid JSON"},
	{name: "unclosed array", in: `[1`, err: "not valid JSON"},
	{name: "key without value", in: `{"a"}`, err: "not valid JSON"},
	{name: "colon without value", in: `{"a":}`, err: "not valid JSON"},
	{name: "unquoted key", in: `{a:1}`, err: "not valid JSON"},
	{name: "single-quoted key", in: `{'a':1}`, err: "not valid JSON"},
	{name: "number key", in: `{1:1}`, err: "not valid JSON"},
	{name: "trailing comma in array", in: `[1,]`, err: "not valid JSON"},
	{name: "trailing comma in object", in: `{"a":1,}`, err: "not valid JSON"},
	{name: "leading comma", in: `[,1]`, err: "not valid JSON"},
	{name: "missing comma", in: `[1 2]`, err: "not valid JSON"},
	{name: "two documents", in: `{}{}`, err: "not valid JSON"},
	{name: "garbage after", in: `[1]x`, err: "not valid JSON"},
	{name: "leading zero", in: `01`, err: "not valid JSON"},
	{name: "negative leading zero", in: `-01`, err: "not valid JSON"},
	{name: "plus sign", in: `+1`, err: "not valid JSON"},
	{name: "leading point", in: `.5`, err: "not valid JSON"},
	{name: "trailing point", in: `1.`, err: "not valid JSON"},
	{name: "point before exponent", in: `1.e5`, err: "not valid JSON"},
	{name: "empty exponent", in: `1e`, err: "not valid JSON"},
	{name: "signed empty exponent", in: `1e+`, err: "not valid JSON"},
	{name: "lone minus", in: `-`, err: "not valid JSON"},
	{name: "double minus", in: `--1`, err: "not valid JSON"},
	{name: "hex", in: `0x10`, err: "not valid JSON"},
	{name: "letter after number", in: `[1x]`, err: "not valid JSON"},
	{name: "underscore after number", in: `1_000`, err: "not valid JSON"},
	{name: "two points", in: `1.2.3`, err: "not valid JSON"},
	{name: "NaN", in: `NaN`, err: "not valid JSON"},
	{name: "Infinity", in: `Infinity`, err: "not valid JSON"},
	{name: "minus Infinity", in: `-Infinity`, err: "not valid JSON"},
	{name: "upper-case true", in: `TRUE`, err: "not valid JSON"},
	{name: "truncated null", in: `nul`, err: "not valid JSON"},
	{name: "glued keyword", in: `truex`, err: "not valid JSON"},
	{name: "glued keywords", in: `[truefalse]`, err: "not valid JSON"},
	{name: "form feed is not whitespace", in: "[1,\f2]", err: "not valid JSON"},
	{name: "vertical tab is not whitespace", in: "\v[]", err: "not valid JSON"},
	{name: "no-break space is not whitespace", in: "[\u00a01]", err: "not valid JSON"},
	{name: "byte order mark", in: "\ufeff{}", err: "not valid JSON"},
	{name: "unterminated string", in: `"abc`, err: "not valid JSON"},
	{name: "unterminated escape", in: `"abc\`, err: "not valid JSON"},
	{name: "invalid escape", in: `"\x41"`, err: "invalid escape"},
	{name: "single-quote escape", in: `"\'"`, err: "invalid escape"},
	{name: "upper-case U escape", in: `"\U0041"`, err: "invalid escape"},
	{name: "non-hex escape", in: `"\u00g0"`, err: "four hexadecimal digits"},
	{name: "short escape", in: `"\u12"`, err: "four hexadecimal digits"},
	{name: "escape cut by the end", in: `"\u12`, err: "not valid JSON"},
	{name: "raw control char", in: "\"a\x01b\"", err: "must be escaped"},
	{name: "raw tab", in: "\"a\tb\"", err: "must be escaped"},
	{name: "raw newline in key", in: "{\"a\nb\":1}", err: "must be escaped"},
	{name: "raw DEL outside string", in: "[\x7f]", err: "not valid JSON"},

	// What jsonb refuses in strings.
	{name: "u0000", in: `"\u0000"`, err: `contains \u0000`},
	{name: "u0000 in text", in: `{"a":"x\u0000y"}`, err: `contains \u0000`},
	{name: "u0000 in key", in: `{"\u0000":1}`, err: `contains \u0000`},
	{name: "lone high surrogate", in: `"\ud800"`, err: "unpaired UTF-16 surrogate"},
	{name: "lone low surrogate", in: `"\udc00"`, err: "unpaired UTF-16 surrogate"},
	{name: "high surrogate then text", in: `"\ud800x"`, err: "unpaired UTF-16 surrogate"},
	{name: "high surrogate then BMP escape", in: `"\ud800\u0041"`, err: "unpaired UTF-16 surrogate"},
	{name: "two high surrogates", in: `"\ud800\ud800"`, err: "unpaired UTF-16 surrogate"},
	{name: "high surrogate then short escape", in: `"\ud800\n"`, err: "unpaired UTF-16 surrogate"},
	{name: "reversed surrogates", in: `"\udc00\ud800"`, err: "unpaired UTF-16 surrogate"},
	{name: "high surrogate then u0000", in: `"\ud800\u0000"`, err: "unpaired UTF-16 surrogate"},

	// What PostgreSQL refuses as text before parsing (pg_verify_mbstr).
	{name: "NUL byte in string", in: "\"a\x00b\"", err: "NUL byte"},
	{name: "NUL byte outside", in: "[1,\x002]", err: "NUL byte"},
	{name: "invalid UTF-8 in string", in: "\"a\xffb\"", err: "not valid UTF-8"},
	{name: "invalid UTF-8 in key", in: "{\"\xc3\":1}", err: "not valid UTF-8"},
	{name: "overlong UTF-8", in: "\"\xc0\xaf\"", err: "not valid UTF-8"},
	{name: "UTF-8 surrogate", in: "\"\xed\xa0\x80\"", err: "not valid UTF-8"},
	{name: "above U+10FFFF", in: "\"\xf4\x90\x80\x80\"", err: "not valid UTF-8"},
	{name: "invalid UTF-8 outside", in: "[\xff]", err: "not valid UTF-8"},

	// Depth: sluice's bound, far below where PostgreSQL's stack runs out.
	{name: "arrays too deep", in: nested("[", "", "]", MaxNestingDepth+1), err: "MaxNestingDepth", sluice: true},
	{name: "objects too deep", in: nested(`{"a":`, "1", "}", MaxNestingDepth+1), err: "MaxNestingDepth", sluice: true},
	{name: "too deep in replaced duplicate", in: `{"a":` + nested("[", "", "]", MaxNestingDepth) + `,"a":1}`, err: "MaxNestingDepth", sluice: true},
	{name: "beyond PostgreSQL's stack", in: nested("[", "", "]", 20000), err: "MaxNestingDepth"},
}

// pgJSONB is PostgreSQL's verdict on one input: its rendering, or its error message.
type pgJSONB struct {
	rendered *string
	err      *string
}

// jsonbOracle returns a pool on a test database with sluice_jsonb_text, which renders its
// argument as jsonb text or returns PostgreSQL's error. The argument is bytea, converted with
// convert_from, which checks the bytes exactly as PostgreSQL checks a text parameter
// (pg_verify_mbstr): so inputs that are not valid UTF-8, or hold NUL bytes, get PostgreSQL's
// verdict too.
func jsonbOracle(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := testdb.Pool(t)
	_, err := pool.Exec(context.Background(), `CREATE FUNCTION sluice_jsonb_text(doc bytea, OUT rendered text, OUT error text)
LANGUAGE plpgsql AS $$
BEGIN
	rendered := convert_from(doc, 'UTF8')::jsonb::text;
EXCEPTION WHEN OTHERS THEN
	error := SQLERRM;
END
$$`)
	require.NoError(t, err)
	var encoding string
	require.NoError(t, pool.QueryRow(context.Background(), "SHOW server_encoding").Scan(&encoding))
	require.Equal(t, "UTF8", encoding, "renderJSONB mirrors a UTF8 database")
	return pool
}

// renderWithPG renders docs with PostgreSQL in one query.
func renderWithPG(t testing.TB, pool *pgxpool.Pool, docs [][]byte) []pgJSONB {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT r.rendered, r.error
		FROM unnest($1::bytea[]) WITH ORDINALITY AS d(doc, n), LATERAL sluice_jsonb_text(d.doc) AS r
		ORDER BY d.n`, docs)
	require.NoError(t, err)
	defer rows.Close()
	res := make([]pgJSONB, 0, len(docs))
	for rows.Next() {
		var v pgJSONB
		require.NoError(t, rows.Scan(&v.rendered, &v.err))
		res = append(res, v)
	}
	require.NoError(t, rows.Err())
	require.Len(t, res, len(docs))
	return res
}

// checkJSONB asserts renderJSONB agrees with PostgreSQL's verdict on in, and returns whether
// PostgreSQL accepted it.
func checkJSONB(t testing.TB, in []byte, pg pgJSONB) bool {
	t.Helper()
	got, err := renderJSONB(in)
	var jerr *jsonbError
	if err != nil {
		require.True(t, errors.As(err, &jerr), "error is a *jsonbError: %v", err)
		require.True(t, jerr.Offset >= 0 && jerr.Offset <= len(in), "offset %d in range for %q", jerr.Offset, clipForLog(in))
	}
	if pg.err != nil {
		require.Error(t, err, "PostgreSQL refuses %q (%s); renderJSONB rendered %q", clipForLog(in), *pg.err, clipForLog(got))
		if jerr.SluiceRule {
			// Only the depth bound is checked before PostgreSQL's own errors are found.
			require.Contains(t, jerr.Problem, "MaxNestingDepth")
			require.Greater(t, nestingDepth(in), MaxNestingDepth)
		}
		if strings.Contains(jerr.Problem, "overflows numeric") && utf8.Valid(in) && bytes.IndexByte(in, 0) < 0 {
			// PostgreSQL checks the encoding first; otherwise both report the first problem.
			require.Contains(t, *pg.err, "value overflows numeric format")
		}
		return false
	}
	rendered := *pg.rendered
	if err != nil {
		// PostgreSQL accepts it: only sluice's bounds may refuse it, and only when they are broken.
		require.True(t, jerr.SluiceRule, "renderJSONB refuses %q, which PostgreSQL accepts as %q: %v", clipForLog(in), clipForLog([]byte(rendered)), err)
		switch {
		case strings.Contains(jerr.Problem, "MaxNumberDigits"):
			require.Greater(t, maxPrintedDigits(rendered), MaxNumberDigits, "refused %q for its digits", clipForLog(in))
		case strings.Contains(jerr.Problem, "MaxNestingDepth"):
			require.Greater(t, nestingDepth(in), MaxNestingDepth)
		default:
			t.Fatalf("unexpected sluice rule: %v", err)
		}
		return true
	}
	require.Equal(t, rendered, string(got), "rendering of %q", clipForLog(in))
	require.LessOrEqual(t, maxPrintedDigits(rendered), MaxNumberDigits, "accepted %q", clipForLog(in))
	require.LessOrEqual(t, nestingDepth(in), MaxNestingDepth, "accepted %q", clipForLog(in))
	// PostgreSQL's rendering is canonical: rendering it again returns it as it is.
	again, err := renderJSONB(got)
	require.NoError(t, err)
	require.Equal(t, string(got), string(again))
	require.True(t, &again[0] == &got[0], "canonical input %q not recognised as canonical", clipForLog(got))
	return true
}

func clipForLog(b []byte) string {
	if len(b) > 200 {
		return string(b[:200]) + fmt.Sprintf("...(%d bytes)", len(b))
	}
	return string(b)
}

// maxPrintedDigits returns the most digits on either side of the point of any number in text,
// a jsonb rendering (which never has exponents).
func maxPrintedDigits(text string) int {
	most := 0
	for i := 0; i < len(text); {
		switch c := text[i]; {
		case c == '"':
			i++
			for i < len(text) && text[i] != '"' {
				if text[i] == '\\' {
					i++
				}
				i++
			}
			i++
		case c == '-' || '0' <= c && c <= '9':
			if c == '-' {
				i++
			}
			run := 0
			for i < len(text) && ('0' <= text[i] && text[i] <= '9' || text[i] == '.') {
				if text[i] == '.' {
					most, run = max(most, run), 0
				} else {
					run++
				}
				i++
			}
			most = max(most, run)
		default:
			i++
		}
	}
	return most
}

// nestingDepth returns the deepest nesting of arrays and objects in a JSON text.
func nestingDepth(in []byte) int {
	depth, most := 0, 0
	for i := 0; i < len(in); i++ {
		switch in[i] {
		case '"':
			for i++; i < len(in) && in[i] != '"'; i++ {
				if in[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			depth++
			most = max(most, depth)
		case ']', '}':
			depth--
		}
	}
	return most
}

func TestRenderJSONBMatchesPostgreSQL(t *testing.T) {
	t.Parallel()
	pool := jsonbOracle(t)
	docs := make([][]byte, len(jsonbCases))
	for i, c := range jsonbCases {
		docs[i] = []byte(c.in)
	}
	verdicts := renderWithPG(t, pool, docs)
	for i, c := range jsonbCases {
		t.Run(c.name, func(t *testing.T) {
			pg := verdicts[i]
			got, err := renderJSONB(docs[i])
			switch {
			case c.err == "":
				require.NoError(t, err)
				require.Equal(t, c.want, string(got))
				require.Nil(t, pg.err, "PostgreSQL refuses %q", clipForLog(docs[i]))
			case c.sluice:
				require.Error(t, err)
				require.Contains(t, err.Error(), c.err)
				require.True(t, err.(*jsonbError).SluiceRule, "a sluice rule: %v", err)
				require.Nil(t, pg.err, "PostgreSQL refuses %q", clipForLog(docs[i]))
			default:
				require.Error(t, err)
				require.Contains(t, err.Error(), c.err)
				if pg.err == nil {
					t.Fatalf("PostgreSQL accepts %q as %q", clipForLog(docs[i]), clipForLog([]byte(*pg.rendered)))
				}
			}
			checkJSONB(t, docs[i], pg)
		})
	}
}

func TestRenderJSONBErrorNamesTheProblem(t *testing.T) {
	t.Parallel()
	_, err := renderJSONB([]byte(`{"a": "x\u0000"}`))
	var jerr *jsonbError
	require.True(t, errors.As(err, &jerr))
	require.Equal(t, 8, jerr.Offset)
	require.Equal(t, `contains \u0000 at byte 8, which PostgreSQL jsonb refuses (text cannot hold a NUL character)`, err.Error())
	require.False(t, jerr.SluiceRule)

	_, err = renderJSONB([]byte(`{"n": 1e131071}`))
	require.True(t, errors.As(err, &jerr))
	require.True(t, jerr.SluiceRule)
	require.Equal(t, 6, jerr.Offset)
	require.Contains(t, err.Error(), "has the number 1e131071 at byte 6, which PostgreSQL would print with 131072 digits before the decimal point and 0 after")

	_, err = renderJSONB([]byte(`[1,]`))
	require.EqualError(t, err, `is not valid JSON: unexpected "]" where a value was expected at byte 3`)
}

func TestRenderJSONBReturnsCanonicalInputAsIs(t *testing.T) {
	t.Parallel()
	in := []byte(`{"id": 42, "tags": ["a", "b"], "total": 12.50, "customer": {"name": "Zoë \"Z\"\n"}}`)
	got, err := renderJSONB(in)
	require.NoError(t, err)
	require.True(t, &got[0] == &in[0], "canonical input is returned without a copy")
	require.Equal(t, string(in), string(got))
}

// jsonbGen writes random JSON documents, mostly valid, with the features renderJSONB must get
// right: nested containers, duplicate keys of varying lengths and spellings, escapes, astral
// characters, control characters, numbers with exponents and leading and trailing zeros, and a
// few invalid pieces.
type jsonbGen struct {
	rng *rand.Rand
	buf []byte
	// spaced: this document is spaced as PostgreSQL prints (", " and ": ", nothing else), so
	// that the fast path for canonical input meets near-canonical documents.
	spaced bool
}

func (g *jsonbGen) doc() []byte {
	g.buf = g.buf[:0]
	g.spaced = g.rng.IntN(4) == 0
	g.space()
	g.value(0)
	g.space()
	return bytes.Clone(g.buf)
}

func (g *jsonbGen) one(options ...string) {
	g.buf = append(g.buf, options[g.rng.IntN(len(options))]...)
}

func (g *jsonbGen) rare() bool { return g.rng.IntN(150) == 0 }

func (g *jsonbGen) space() {
	if !g.spaced && g.rng.IntN(3) == 0 {
		g.one(" ", "  ", "\n", "\t", "\r\n", "\n\t ")
	}
}

// separator writes a ',' or ':' and the whitespace after it.
func (g *jsonbGen) separator(c byte) {
	g.buf = append(g.buf, c)
	if g.spaced {
		g.buf = append(g.buf, ' ')
	} else {
		g.space()
	}
}

func (g *jsonbGen) value(depth int) {
	kind := g.rng.IntN(10)
	if depth >= 5 {
		kind = 4 + g.rng.IntN(6)
	}
	switch {
	case kind < 2:
		g.object(depth)
	case kind < 4:
		g.array(depth)
	case kind < 6:
		g.str()
	case kind < 9:
		g.number()
	default:
		if g.rare() {
			g.one("True", "nul", "nulll", "undefined", "NaN", "'x'")
			return
		}
		g.one("true", "false", "null")
	}
}

func (g *jsonbGen) object(depth int) {
	g.buf = append(g.buf, '{')
	g.space()
	n := g.rng.IntN(7)
	for k := 0; k < n; k++ {
		if k > 0 {
			g.separator(',')
		}
		if g.rng.IntN(4) == 0 {
			g.str()
		} else {
			g.one(`"a"`, `"b"`, `"B"`, `"aa"`, `"ab"`, `"ba"`, `""`, `"\u0061"`, `"\u0062"`, `"é"`, `"\u00e9"`,
				`"z"`, `"zz"`, `"id"`, `"ID"`, `"kéy"`, `"key"`, `"😀"`, `"\ud83d\ude00"`, `"a\nb"`, `"a\u000ab"`,
				`"\/"`, `"/"`, `"\u001f"`, `"_"`, `"longer_key_name"`, `"longer_key_namf"`)
		}
		g.space()
		if g.rare() {
			g.one(`=`, ``, `::`)
		} else {
			g.separator(':')
		}
		g.value(depth + 1)
		g.space()
	}
	if n > 0 && g.rare() {
		g.buf = append(g.buf, ',')
	}
	g.buf = append(g.buf, '}')
}

func (g *jsonbGen) array(depth int) {
	g.buf = append(g.buf, '[')
	g.space()
	n := g.rng.IntN(6)
	for k := 0; k < n; k++ {
		if k > 0 {
			g.separator(',')
		}
		g.value(depth + 1)
		g.space()
	}
	if n > 0 && g.rare() {
		g.buf = append(g.buf, ',')
	}
	g.buf = append(g.buf, ']')
}

func (g *jsonbGen) hex4(cp int) {
	s := fmt.Sprintf(`\u%04x`, cp)
	if g.rng.IntN(3) == 0 {
		s = `\u` + strings.ToUpper(s[2:])
	}
	g.buf = append(g.buf, s...)
}

func (g *jsonbGen) str() {
	g.buf = append(g.buf, '"')
	n := g.rng.IntN(12)
	for k := 0; k < n; k++ {
		switch p := g.rng.IntN(20); {
		case g.rare():
			switch g.rng.IntN(8) {
			case 0:
				g.buf = append(g.buf, `\u0000`...)
			case 1:
				g.hex4(0xD800 + g.rng.IntN(0x400)) // lone high surrogate
			case 2:
				g.hex4(0xDC00 + g.rng.IntN(0x400)) // lone low surrogate
			case 3:
				g.buf = append(g.buf, byte(1+g.rng.IntN(0x1f))) // raw control character
			case 4:
				g.one(`\x`, `\'`, `\U0041`, `\u12g4`, `\a`)
			case 5:
				g.buf = append(g.buf, 0xff)
			case 6:
				g.buf = append(g.buf, 0)
			default:
				g.buf = append(g.buf, 0xed, 0xa0, 0x80)
			}
		case p < 8:
			g.buf = append(g.buf, byte(0x20+g.rng.IntN(0x5f)))
			if c := g.buf[len(g.buf)-1]; c == '"' || c == '\\' {
				g.buf[len(g.buf)-1] = 'q'
			}
		case p < 10:
			g.one(`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, "/")
		case p < 12:
			g.hex4(1 + g.rng.IntN(0x7f)) // control characters, ASCII and DEL by code
		case p < 14:
			cp := 0x80 + g.rng.IntN(0xFFFF-0x80)
			if cp >= 0xD800 && cp <= 0xDFFF {
				cp = 0xE9
			}
			g.hex4(cp)
		case p < 16:
			cp := 0x10000 + g.rng.IntN(0x100000)
			cp -= 0x10000
			g.hex4(0xD800 + cp>>10)
			g.hex4(0xDC00 + cp&0x3FF)
		default:
			g.one("é", "中", "😀", "\u2028", "\x7f", "\uffff", "\U0010FFFF", "𝄞", "ß")
		}
	}
	g.buf = append(g.buf, '"')
}

func (g *jsonbGen) digits(n int, first string) {
	g.buf = append(g.buf, first...)
	for k := 0; k < n; k++ {
		g.buf = append(g.buf, byte('0'+g.rng.IntN(10)))
	}
}

func (g *jsonbGen) number() {
	if g.rare() {
		g.one("01", "-01", "+1", ".5", "1.", "1.e5", "1e", "1e+", "-", "--1", "0x1", "1_0", "1.2.3", "Infinity", "-0x")
		return
	}
	if g.rng.IntN(4) == 0 {
		g.buf = append(g.buf, '-')
	}
	if g.rng.IntN(3) == 0 {
		g.buf = append(g.buf, '0')
	} else {
		g.digits(g.rng.IntN(25), string(rune('1'+g.rng.IntN(9))))
	}
	if g.rng.IntN(5) < 2 {
		g.buf = append(g.buf, '.')
		g.digits(1+g.rng.IntN(20), "")
		if g.rng.IntN(3) == 0 {
			g.buf = append(g.buf, strings.Repeat("0", 1+g.rng.IntN(5))...)
		}
	}
	if g.rng.IntN(10) < 3 {
		g.one("e", "E")
		g.one("", "+", "-")
		g.buf = append(g.buf, strings.Repeat("0", g.rng.IntN(3))...)
		switch p := g.rng.IntN(40); {
		case p == 0:
			g.one("131071", "131072", "16383", "16384", "1073741823", "99999999999999999999")
		case p < 4:
			g.buf = append(g.buf, fmt.Sprint(75+g.rng.IntN(60))...)
		default:
			g.buf = append(g.buf, fmt.Sprint(g.rng.IntN(30))...)
		}
	}
}

func TestRenderJSONBRandomDocumentsMatchPostgreSQL(t *testing.T) {
	t.Parallel()
	pool := jsonbOracle(t)
	const total, batch = 6000, 500
	g := &jsonbGen{rng: rand.New(rand.NewPCG(20261130, 10))}
	accepted, refusedBySluice, asIs := 0, 0, 0
	for done := 0; done < total; done += batch {
		docs := make([][]byte, batch)
		for i := range docs {
			docs[i] = g.doc()
		}
		for i, pg := range renderWithPG(t, pool, docs) {
			if checkJSONB(t, docs[i], pg) {
				accepted++
				out, err := renderJSONB(docs[i])
				switch {
				case err != nil:
					refusedBySluice++
				case &out[0] == &docs[i][0]:
					asIs++
				}
			}
		}
	}
	t.Logf("%d random documents compared with PostgreSQL: %d accepted by PostgreSQL (%d of them refused by sluice's bounds, %d already canonical), %d refused",
		total, accepted, refusedBySluice, asIs, total-accepted)
	require.Greater(t, accepted, total/2, "the generator mostly writes valid documents")
	require.Greater(t, total-accepted, total/50, "the generator writes some invalid documents")
}

func FuzzRenderJSONB(f *testing.F) {
	for _, c := range jsonbCases {
		if len(c.in) <= 4096 {
			f.Add([]byte(c.in))
		}
	}
	f.Add([]byte(`{"order":{"id":"o-42","lines":[{"sku":"A-1","qty":2,"price":12.50}],"total":2.5e1},"at":"2026-11-30T15:30:00Z"}`))
	pool := jsonbOracle(f)
	f.Fuzz(func(t *testing.T, in []byte) {
		// Inputs that are not valid UTF-8 or hold NUL cannot be sent as a text parameter; they go
		// as bytea through convert_from, which applies PostgreSQL's same check, so every input is
		// compared.
		pg := renderWithPG(t, pool, [][]byte{in})[0]
		checkJSONB(t, in, pg)
		if !utf8.Valid(in) || bytes.IndexByte(in, 0) >= 0 {
			_, err := renderJSONB(in)
			require.Error(t, err, "PostgreSQL text cannot hold %q", clipForLog(in))
		}
	})
}

// benchmarkEvent is a typical ~1 KB event as encoding/json writes it: compact, fields in
// declaration order (not jsonb's), a few escapes and numbers.
var benchmarkEvent = func() []byte {
	type line struct {
		SKU      string  `json:"sku"`
		Name     string  `json:"name"`
		Quantity int     `json:"quantity"`
		Price    float64 `json:"unit_price"`
	}
	b, err := json.Marshal(struct {
		OrderID    string            `json:"order_id"`
		CustomerID string            `json:"customer_id"`
		Status     string            `json:"status"`
		Currency   string            `json:"currency"`
		Total      float64           `json:"total"`
		Lines      []line            `json:"lines"`
		Shipping   map[string]string `json:"shipping_address"`
		Notes      string            `json:"notes"`
		Tags       []string          `json:"tags"`
		CreatedAt  string            `json:"created_at"`
		Gift       bool              `json:"gift"`
		Coupon     *string           `json:"coupon"`
	}{
		OrderID: "ord_01JD8X5Q4RZ9M7K2V3T6W8Y0AB", CustomerID: "cus_7f3a9c21", Status: "confirmed", Currency: "EUR", Total: 327.4,
		Lines: []line{
			{"SKU-1001", "Espresso beans \"Dark\" 1kg", 2, 24.9},
			{"SKU-2040", "Grinder, conical burr", 1, 189},
			{"SKU-3300", "Milk jug 600ml", 1, 19.5},
			{"SKU-4410", "Descaler (3×)", 3, 12.7},
			{"SKU-5120", "Filter papers, size 4 (100)", 2, 4.5},
		},
		Shipping:  map[string]string{"name": "Zoë Müller", "street": "Hauptstraße 5", "city": "München", "postal_code": "80331", "country": "DE"},
		Notes:     "Please ring twice.\nLeave at the door if nobody answers; the neighbours at <No. 7> can also accept parcels & letters.",
		Tags:      []string{"priority", "gift-wrap", "newsletter", "returning-customer"},
		CreatedAt: "2026-11-30T15:30:00.123456Z", Gift: true,
	})
	if err != nil {
		panic(err)
	}
	return b
}()

func BenchmarkRenderJSONB(b *testing.B) {
	b.Run("typical", func(b *testing.B) {
		b.SetBytes(int64(len(benchmarkEvent)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := renderJSONB(benchmarkEvent); err != nil {
				b.Fatal(err)
			}
		}
	})
	canonical, err := renderJSONB(benchmarkEvent)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("canonical", func(b *testing.B) {
		b.SetBytes(int64(len(canonical)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := renderJSONB(canonical); err != nil {
				b.Fatal(err)
			}
		}
	})
}
