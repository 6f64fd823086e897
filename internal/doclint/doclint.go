// Package doclint checks that the documentation of general code does not describe it as one
// destination's. `make lint` runs it over the public packages (internal/cmd/doclint) and the CLI's
// tests run it over every command's help.
//
// The rule: the doc comment of a general exported name (a package, a type, a function, a
// method, a constant, a variable, a struct field or an interface method) names either none of
// its package's destinations or all of them. A name is specific to a destination, and exempt,
// when the destination's word is part of its name, of its receiver's or enclosing type's name,
// of a type in its signature, or of its file's name (sns.go, kafka_consume.go, ...). So "Topics
// maps a topic to an SNS topic ARN" fails on a general RelayConfig field, and "an SNS topic, an
// EventBridge bus, a Kinesis stream or a Kafka topic" passes.
package doclint

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// destination is one product a package's general code must not be described as: its display
// name and the pattern that finds it in prose (word boundaries, case as written in prose).
type destination struct {
	name    string
	pattern *regexp.Regexp
}

func dest(name, pattern string) destination {
	return destination{name: name, pattern: regexp.MustCompile(`\b(?:` + pattern + `)\b`)}
}

var (
	sns         = dest("SNS", `SNS`)
	sqs         = dest("SQS", `SQS`)
	eventBridge = dest("EventBridge", `EventBridge`)
	kinesis     = dest("Kinesis", `Kinesis`)
	kafka       = dest("Kafka", `Kafka|MSK`)
)

// destinationsOf names, per package directory (its last element), the destinations its general
// code serves. Packages not listed serve every destination the outbox publishes to.
var destinationsOf = map[string][]destination{
	"inbox": {sqs, kinesis, kafka},
}

var outboxDestinations = []destination{sns, eventBridge, kinesis, kafka}

// everyDestination is what makes a name specific, whichever package it is in: an SQS limit in
// pkg/outbox (DefaultSQSMaxMessageBytes) is about SQS even though the outbox does not publish to it.
var everyDestination = []destination{sns, sqs, eventBridge, kinesis, kafka}

// Finding is one doc comment that names some destinations but not all.
type Finding struct {
	Pos     token.Position // where the comment starts
	Name    string         // the documented name (Type.Field for members)
	Named   []string       // the destinations it names
	Missing []string       // the destinations it leaves out
}

// String renders a finding as file:line: name: what is wrong.
func (f Finding) String() string {
	return fmt.Sprintf("%s: %s: the doc names %s but not %s: general text names every destination or none (or name the code after its destination)",
		f.Pos, f.Name, strings.Join(f.Named, ", "), strings.Join(f.Missing, ", "))
}

// Prose reports which of the outbox's destinations a general text names and which it leaves
// out; the text passes when one of the two is empty.
func Prose(text string) (named, missing []string) {
	return split(outboxDestinations, text)
}

func split(dests []destination, text string) (named, missing []string) {
	for _, d := range dests {
		if d.pattern.MatchString(text) {
			named = append(named, d.name)
		} else {
			missing = append(missing, d.name)
		}
	}
	return named, missing
}

// Dir checks the non-test Go files of one package directory.
func Dir(dir string) ([]Finding, error) {
	dests, ok := destinationsOf[filepath.Base(filepath.Clean(dir))]
	if !ok {
		dests = outboxDestinations
	}
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	l := linter{fset: fset, dests: dests}
	for _, e := range entries { // ReadDir sorts by name: findings come in file order
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		path := filepath.Join(dir, name)
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		l.file(path, f)
	}
	return l.found, nil
}

type linter struct {
	fset  *token.FileSet
	dests []destination
	found []Finding
}

// specific reports whether any of the words (identifiers, a file's base name) names a destination.
func (l *linter) specific(words ...string) bool {
	for _, w := range words {
		lw := strings.ToLower(w)
		for _, d := range everyDestination {
			for _, alt := range strings.Split(d.pattern.String()[len(`\b(?:`):len(d.pattern.String())-len(`)\b`)], "|") {
				if strings.Contains(lw, strings.ToLower(alt)) {
					return true
				}
			}
		}
	}
	return false
}

func (l *linter) check(doc *ast.CommentGroup, name string, context ...string) {
	if doc == nil || l.specific(append(context, name)...) {
		return
	}
	named, missing := split(l.dests, doc.Text())
	if len(named) > 0 && len(missing) > 0 {
		l.found = append(l.found, Finding{Pos: l.fset.Position(doc.Pos()), Name: name, Named: named, Missing: missing})
	}
}

func (l *linter) file(path string, f *ast.File) {
	base := strings.TrimSuffix(filepath.Base(path), ".go")
	l.check(f.Doc, "package "+f.Name.Name, base)
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			recv := ""
			if d.Recv != nil && len(d.Recv.List) > 0 {
				recv = typeName(d.Recv.List[0].Type)
				if !ast.IsExported(recv) {
					continue
				}
			}
			l.check(d.Doc, d.Name.Name, append(identifiers(d.Type), base, recv)...)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					doc := s.Doc
					if doc == nil && len(d.Specs) == 1 {
						doc = d.Doc
					}
					l.check(doc, s.Name.Name, base)
					l.members(s, base)
				case *ast.ValueSpec:
					doc := s.Doc
					if doc == nil && len(d.Specs) == 1 {
						doc = d.Doc
					}
					for _, n := range s.Names {
						if n.IsExported() {
							l.check(doc, n.Name, base, typeName(s.Type))
						}
					}
				}
			}
		}
	}
}

// members checks the exported fields of a struct and the methods of an interface.
func (l *linter) members(s *ast.TypeSpec, base string) {
	var fields *ast.FieldList
	switch t := s.Type.(type) {
	case *ast.StructType:
		fields = t.Fields
	case *ast.InterfaceType:
		fields = t.Methods
	default:
		return
	}
	for _, fl := range fields.List {
		for _, n := range fl.Names {
			if n.IsExported() {
				l.check(fl.Doc, s.Name.Name+"."+n.Name, base, s.Name.Name)
			}
		}
	}
}

// identifiers lists the names a function's signature mentions: Parse(events.SQSMessage) is about SQS.
func identifiers(n ast.Node) []string {
	var names []string
	ast.Inspect(n, func(n ast.Node) bool {
		if id, ok := n.(*ast.Ident); ok {
			names = append(names, id.Name)
		}
		return true
	})
	return names
}

func typeName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return typeName(t.X)
	case *ast.Ident:
		return t.Name
	case *ast.SelectorExpr:
		return t.Sel.Name
	case *ast.IndexExpr:
		return typeName(t.X)
	case *ast.IndexListExpr:
		return typeName(t.X)
	}
	return ""
}
