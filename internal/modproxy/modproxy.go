// Package modproxy serves this repository's Go modules, as they are in the working tree, from a
// file-system module proxy (the GOPROXY protocol's file layout, https://go.dev/ref/mod#goproxy-protocol),
// so a module outside the repository can require, build and `go install` them exactly as it
// would a published release: a `file://` GOPROXY entry in front of the machine's usual proxy.
//
// Every module listed in go.work is served at one version, the version the sub-modules require
// of the root module (see [Version]): releases tag all of them together. A module's zip holds the
// files git tracks or would track (`git ls-files --cached --others --exclude-standard`) under its
// directory, minus nested modules, in the module zip format of https://go.dev/ref/mod#zip-files;
// the go command checks that format, and computes the checksums, when it downloads from the proxy.
package modproxy

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Version is the version every module of the repository is served at, and the version at which
// cmd/sluice, infra and bench require the root module: the next release, which tags the four
// modules at one commit (v0.1.0, cmd/sluice/v0.1.0, infra/v0.1.0, bench/v0.1.0).
const Version = "v0.1.0"

// Module is one Go module of the repository.
type Module struct {
	// Path is the module path, from its go.mod.
	Path string
	// Dir is the module's directory, relative to the repository root ("." for the root module).
	Dir string
}

// Modules returns the modules go.work uses, read with `go work edit -json` and `go mod edit -json`.
func Modules(root string) ([]Module, error) {
	var work struct {
		Use []struct{ DiskPath string }
	}
	if err := goJSON(root, &work, "work", "edit", "-json"); err != nil {
		return nil, fmt.Errorf("read go.work: %w", err)
	}
	var out []Module
	for _, u := range work.Use {
		dir := filepath.ToSlash(filepath.Clean(u.DiskPath))
		var mod struct{ Module struct{ Path string } }
		if err := goJSON(filepath.Join(root, dir), &mod, "mod", "edit", "-json"); err != nil {
			return nil, fmt.Errorf("read %s/go.mod: %w", dir, err)
		}
		out = append(out, Module{Path: mod.Module.Path, Dir: dir})
	}
	if len(out) == 0 {
		return nil, errors.New("go.work uses no module")
	}
	return out, nil
}

func goJSON(dir string, v any, args ...string) error {
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return json.Unmarshal(b, v)
}

// Build writes a file-system module proxy into dst that serves every module of the repository
// at root (see [Modules]) at version, with each module's files as they are in the working tree.
// It returns the modules it wrote.
func Build(dst, root, version string) ([]Module, error) {
	mods, err := Modules(root)
	if err != nil {
		return nil, err
	}
	files, err := workingTreeFiles(root)
	if err != nil {
		return nil, err
	}
	// A directory holding a go.mod starts a module: its files belong to no enclosing module.
	var moduleDirs []string
	for _, f := range files {
		if path.Base(f) == "go.mod" {
			moduleDirs = append(moduleDirs, path.Dir(f))
		}
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return nil, err
	}
	for _, m := range mods {
		gomod, err := os.ReadFile(filepath.Join(root, m.Dir, "go.mod"))
		if err != nil {
			return nil, err
		}
		var zipped bytes.Buffer
		if err := writeZip(&zipped, root, m, version, ownFiles(m.Dir, files, moduleDirs)); err != nil {
			return nil, fmt.Errorf("zip module %s: %w", m.Path, err)
		}
		// Module paths here are lower case, so they need no case-encoding ("!x") in the layout.
		at := filepath.Join(dst, filepath.FromSlash(m.Path), "@v")
		if err := os.MkdirAll(at, 0o755); err != nil {
			return nil, err
		}
		for name, body := range map[string][]byte{
			"list":            []byte(version + "\n"),
			version + ".info": info,
			version + ".mod":  gomod,
			version + ".zip":  zipped.Bytes(),
		} {
			if err := os.WriteFile(filepath.Join(at, name), body, 0o644); err != nil {
				return nil, err
			}
		}
	}
	return mods, nil
}

// workingTreeFiles lists, relative to root and slash-separated, the regular files git tracks or
// would track: what a release tag would hold if the working tree were committed.
func workingTreeFiles(root string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("list the working tree's files with git: %w", err)
	}
	var files []string
	seen := map[string]bool{}
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" || seen[f] {
			continue
		}
		seen[f] = true
		st, err := os.Lstat(filepath.Join(root, filepath.FromSlash(f)))
		if errors.Is(err, fs.ErrNotExist) {
			continue // tracked, deleted in the working tree
		}
		if err != nil {
			return nil, err
		}
		if st.Mode().IsRegular() { // module zips hold no symbolic links
			files = append(files, f)
		}
	}
	sort.Strings(files)
	return files, nil
}

// ownFiles returns the files under dir that belong to no module nested in it.
func ownFiles(dir string, files, moduleDirs []string) []string {
	under := func(f, d string) bool { return d == "." || strings.HasPrefix(f, d+"/") }
	var out []string
	for _, f := range files {
		if !under(f, dir) {
			continue
		}
		nested := false
		for _, d := range moduleDirs {
			if d != dir && under(d, dir) && under(f, d) {
				nested = true
				break
			}
		}
		if !nested {
			out = append(out, f)
		}
	}
	return out
}

func writeZip(w *bytes.Buffer, root string, m Module, version string, files []string) error {
	zw := zip.NewWriter(w)
	prefix := m.Path + "@" + version + "/"
	for _, f := range files {
		body, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			return err
		}
		rel := f
		if m.Dir != "." {
			rel = strings.TrimPrefix(f, m.Dir+"/")
		}
		fw, err := zw.CreateHeader(&zip.FileHeader{Name: prefix + rel, Method: zip.Deflate})
		if err != nil {
			return err
		}
		if _, err := fw.Write(body); err != nil {
			return err
		}
	}
	return zw.Close()
}
