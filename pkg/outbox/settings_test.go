package outbox_test

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/outbox"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the settings table in docs/outbox.md from outbox.RelaySettings")

// Each entry of RelaySettings is whole: a field that exists, a unit, a default inside its
// bounds, a doc; fields, variables and flags are each named once.
func TestSettingsAreWellFormed(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, s := range outbox.RelaySettings() {
		require.Contains(t, []string{"count", "bytes", "duration"}, s.Unit, s.Field)
		require.NotEmpty(t, s.Doc, s.Field)
		require.LessOrEqual(t, s.Min, s.Max, s.Field)
		if s.Default != 0 {
			require.NoError(t, s.Check(s.Default), "%s: the default is inside the bounds", s.Field)
		}
		require.Error(t, s.Check(s.Min-1), s.Field)
		require.Error(t, s.Check(s.Max+1), s.Field)
		for _, name := range []string{"field " + s.Field, "env " + s.Env, "flag " + s.Flag} {
			if !strings.HasSuffix(name, " ") {
				require.False(t, seen[name], "%s is declared twice", name)
				seen[name] = true
			}
		}
		var c outbox.RelayConfig
		s.Set(&c, s.Max)
		require.Equal(t, s.Max, s.Get(c), "%s: Set and Get reach the same field", s.Field)
		back, err := s.Parse(s.Text(s.Max))
		require.NoError(t, err)
		require.Equal(t, s.Max, back, "%s: Parse reads what Text writes", s.Field)
		require.Equal(t, s.Env, outbox.RelaySetting(s.Field).Env, s.Field)
	}
	require.Panics(t, func() { outbox.RelaySetting("NoSuchField") })
}

// Every number of RelayConfig, MessageLimits and ClaimCheck is declared in RelaySettings: a
// new field without an entry fails here.
func TestEveryNumberOfRelayConfigIsASetting(t *testing.T) {
	t.Parallel()
	declared := map[string]bool{}
	for _, s := range outbox.RelaySettings() {
		declared[s.Field] = true
	}
	var missing []string
	var walk func(typ reflect.Type, prefix string)
	walk = func(typ reflect.Type, prefix string) {
		for i := range typ.NumField() {
			f := typ.Field(i)
			switch {
			case !f.IsExported(): // test hooks, not settings
			case f.Type == reflect.TypeFor[outbox.MessageLimits]():
				walk(f.Type, f.Name+".")
			case f.Type == reflect.TypeFor[*outbox.ClaimCheck]():
				walk(f.Type.Elem(), f.Name+".")
			case f.Type.Kind() == reflect.Int || f.Type == reflect.TypeFor[time.Duration]():
				if !declared[prefix+f.Name] {
					missing = append(missing, prefix+f.Name)
				}
			}
		}
	}
	walk(reflect.TypeFor[outbox.RelayConfig](), "")
	require.Empty(t, missing, "add an entry to outbox.RelaySettings for each")
}

// WithDefaults gives every zero field its declared default, and CheckSettings refuses each
// field just outside its bounds, naming it.
func TestSettingsDefaultsAndBoundsApply(t *testing.T) {
	t.Parallel()
	cfg := outbox.RelayConfig{}.WithDefaults()
	for _, s := range outbox.RelaySettings() {
		if !strings.HasPrefix(s.Field, "ClaimCheck.") {
			require.Equal(t, s.Default, s.Get(cfg), s.Field)
		}
	}
	for _, s := range outbox.RelaySettings() {
		if strings.HasPrefix(s.Field, "ClaimCheck.") {
			cc := outbox.RelayConfig{ClaimCheck: &outbox.ClaimCheck{}}
			s.Set(&cc, s.Max+1)
			require.ErrorContains(t, cc.ClaimCheck.Check(), s.Field+" must be ")
			require.ErrorContains(t, cc.ClaimCheck.Check(), "got "+s.Text(s.Max+1))
			continue
		}
		var c outbox.RelayConfig
		s.Set(&c, s.Max+1)
		require.ErrorContains(t, c.CheckSettings(), s.Field+" must be ", s.Field)
		require.ErrorContains(t, c.CheckSettings(), "got "+s.Text(s.Max+1), s.Field)
	}
}

// The doc comment of each field says its default as Format writes it, so that the defaults
// read in the code are the table's.
func TestSettingsFieldDocsQuoteTheDefault(t *testing.T) {
	t.Parallel()
	docs := fieldDocs(t, "relay.go", "size.go", "claimcheck.go")
	for _, s := range outbox.RelaySettings() {
		doc, ok := docs[s.Field]
		require.True(t, ok, "no doc comment found for %s", s.Field)
		want := "Defaults to " + s.Format(s.Default)
		if s.Default == 0 {
			want = "Defaults to 0" // and what 0 means
		}
		require.Contains(t, strings.Join(strings.Fields(doc), " "), want, "the doc comment of %s", s.Field)
	}
}

// fieldDocs returns the doc comment of every field of the structs in files, by "Struct.Field"
// for nested ones (MessageLimits, ClaimCheck) and "Field" for RelayConfig's.
func fieldDocs(t *testing.T, files ...string) map[string]string {
	docs := map[string]string{}
	for _, name := range files {
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ParseComments)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				return false
			}
			prefix := ts.Name.Name + "."
			if ts.Name.Name == "RelayConfig" {
				prefix = ""
			}
			for _, fl := range st.Fields.List {
				for _, id := range fl.Names {
					docs[prefix+id.Name] = fl.Doc.Text()
				}
			}
			return false
		})
	}
	return docs
}

const docsBegin, docsEnd = "<!-- settings table: generated from outbox.RelaySettings by TestSettingsDocs -->\n", "<!-- end of settings table -->\n"

// docs/outbox.md's settings table is RelaySettings rendered; -update-docs rewrites it.
func TestSettingsDocs(t *testing.T) {
	const path = "../../docs/outbox.md"
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	doc := string(raw)
	begin, end := strings.Index(doc, docsBegin), strings.Index(doc, docsEnd)
	require.True(t, begin >= 0 && end > begin, "docs/outbox.md has no settings table markers")
	want := docsBegin + settingsTable() + docsEnd
	got := doc[begin : end+len(docsEnd)]
	if *updateDocs {
		require.NoError(t, os.WriteFile(path, []byte(doc[:begin]+want+doc[end+len(docsEnd):]), 0o644))
		return
	}
	require.Equal(t, want, got, "run: go test ./pkg/outbox -run TestSettingsDocs -update-docs")
}

// settingsTable renders RelaySettings as docs/outbox.md shows it.
func settingsTable() string {
	var b strings.Builder
	b.WriteString("| field | variable | default | range | meaning |\n|---|---|---|---|---|\n")
	for _, s := range outbox.RelaySettings() {
		vars := "code only"
		if s.Env != "" {
			vars = "`" + s.Env + "`"
		}
		if s.Flag != "" {
			vars += ", `--" + s.Flag + "`"
		}
		def := s.Format(s.Default)
		if s.Default == 0 {
			def = "0 (see meaning)"
		}
		meaning := s.Doc
		if s.Source != "" {
			meaning += ". Default: " + s.Source
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s to %s | %s |\n", s.Field, vars, def, s.Format(s.Min), s.Format(s.Max), meaning)
	}
	return b.String()
}
