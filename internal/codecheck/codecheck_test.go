package codecheck

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const modPath = "github.com/sandirect/sandirect"

// goFile is one parsed Go source file of the module.
type goFile struct {
	path string // relative to the module root, slash-separated
	pkg  string // the package's directory, relative to the root
	test bool   // a _test.go file
	gen  bool   // generated ("Code generated … DO NOT EDIT.")
	fset *token.FileSet
	file *ast.File
}

// moduleRoot finds the directory of go.mod above the working directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = parent
	}
}

// walk calls fn for every file of the module (not of nested modules,
// testdata or hidden directories), with its path relative to root.
func walk(t *testing.T, root string, fn func(rel string)) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && rel != "." {
				return filepath.SkipDir // a module of its own (bench/shmipc)
			}
			return nil
		}
		fn(rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// goFiles parses every Go file of the module.
func goFiles(t *testing.T) []goFile {
	t.Helper()
	root := moduleRoot(t)
	var files []goFile
	walk(t, root, func(rel string) {
		if !strings.HasSuffix(rel, ".go") {
			return
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, goFile{
			path: rel, pkg: filepath.ToSlash(filepath.Dir(rel)),
			test: strings.HasSuffix(rel, "_test.go"), gen: ast.IsGenerated(f),
			fset: fset, file: f,
		})
	})
	if len(files) == 0 {
		t.Fatal("no Go files found")
	}
	return files
}

// rank places a package of the module in the layers: a package imports
// only packages of a lower rank. Packages of one rank sit beside each
// other and import none of each other. A new package must be given a
// rank here.
func rank(pkg string) (int, bool) {
	switch {
	case pkg == "bench" || strings.HasPrefix(pkg, "bench/") || strings.HasPrefix(pkg, "tools/"),
		strings.HasPrefix(pkg, "scripts/"): // scripts/vminit: the VM tests' init
		return 7, true
	case pkg == "sockets":
		return 6, true
	case pkg == "nic":
		return 5, true
	case pkg == "pin", pkg == "stats":
		return 4, true
	case pkg == "shm", pkg == "internal/bpfmon":
		return 3, true
	case pkg == "internal/sys":
		return 1, true // the system calls; off Linux, feature's errors
	case pkg == "internal/feature", pkg == "internal/quiesce", pkg == "internal/gopool", pkg == "internal/codecheck", pkg == "internal/lockrank":
		return 0, true // nothing of ours below
	case strings.HasPrefix(pkg, "internal/"):
		return 2, true // copies, test helpers: on top of internal/sys
	}
	return 0, false
}

// TestImportsPointDown checks the layering: every import of a package of
// ours by a file (tests too) points to a lower rank, only internal/sys
// imports golang.org/x/sys/unix, and only shm and internal use unsafe
// outside tests.
func TestImportsPointDown(t *testing.T) {
	for _, f := range goFiles(t) {
		from, ok := rank(f.pkg)
		if !ok {
			t.Errorf("%s: package %s has no rank in the layers (codecheck_test.go, rank)", f.path, f.pkg)
			continue
		}
		for _, imp := range f.file.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if path == "golang.org/x/sys/unix" && f.pkg != "internal/sys" {
				t.Errorf("%s imports golang.org/x/sys/unix: only internal/sys may", f.path)
			}
			if path == "unsafe" && !f.test && f.pkg != "shm" && !strings.HasPrefix(f.pkg, "internal/") {
				t.Errorf("%s imports unsafe: only shm and internal may (tests may, to check layouts)", f.path)
			}
			dep, ours := strings.CutPrefix(path, modPath+"/")
			if !ours || dep == f.pkg {
				continue
			}
			to, ok := rank(dep)
			switch {
			case !ok:
				t.Errorf("%s imports %s, which has no rank in the layers", f.path, path)
			case to >= from:
				t.Errorf("%s imports %s: an import beside or above %s (ranks %d → %d); imports point down", f.path, dep, f.pkg, from, to)
			}
		}
	}
}

// The library's packages, whose functions must fit in maxFuncLines.
func library(pkg string) bool {
	switch pkg {
	case "shm", "pin", "nic", "sockets", "stats":
		return true
	}
	return strings.HasPrefix(pkg, "internal/")
}

// maxFuncLines is the longest a library function may be, from its func
// keyword to its closing brace.
const maxFuncLines = 80

// tooLong lists the library functions over maxFuncLines that are known,
// waiting for the rework of their package (issue 22). Remove an entry when
// its function is split; the test fails while a listed function fits, so
// that the list only shrinks.
var tooLong = map[string]bool{}

// funcName names a function as pkg.Func or pkg.(*T).Method.
func funcName(pkg string, d *ast.FuncDecl) string {
	name := d.Name.Name
	if d.Recv != nil && len(d.Recv.List) > 0 {
		typ := d.Recv.List[0].Type
		star := ""
		if s, ok := typ.(*ast.StarExpr); ok {
			typ, star = s.X, "*"
		}
		if ix, ok := typ.(*ast.IndexExpr); ok {
			typ = ix.X
		}
		if ix, ok := typ.(*ast.IndexListExpr); ok {
			typ = ix.X
		}
		if id, ok := typ.(*ast.Ident); ok {
			name = fmt.Sprintf("(%s%s).%s", star, id.Name, name)
		}
	}
	return pkg + "." + name
}

// TestFunctionLength: no function of a library package (not its tests,
// nor generated code) is over maxFuncLines, but those listed in tooLong.
func TestFunctionLength(t *testing.T) {
	long := map[string]int{}
	for _, f := range goFiles(t) {
		if f.test || f.gen || !library(f.pkg) {
			continue
		}
		for _, d := range f.file.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := f.fset.Position(fd.End()).Line - f.fset.Position(fd.Pos()).Line + 1
			if n > maxFuncLines {
				long[funcName(f.pkg, fd)] = n
				if !tooLong[funcName(f.pkg, fd)] {
					t.Errorf("%s: %s is %d lines, over %d: split it", f.path, funcName(f.pkg, fd), n, maxFuncLines)
				}
			}
		}
	}
	var names []string
	for name := range tooLong {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if n, ok := long[name]; ok {
			t.Logf("%s: %d lines (listed in tooLong)", name, n)
		} else {
			t.Errorf("%s is listed in tooLong but is %d lines or fewer now, or gone: remove it from the list", name, maxFuncLines)
		}
	}
}

// steering matches references to documents and seed material that are
// not in the repository. Spelled in pieces, so that this file does not
// match it.
var steering = regexp.MustCompile(`shared/(SPEC|DESIGN|STYLE)|\.\./shared|seed 00[0-9]|` +
	`(SPEC|DESIGN|STYLE)` + `\.md|the seed` + `'s`)

// TestSelfContained: no Go, C, shell or Markdown file points to the
// steering repository's documents or to a seed by number; the design's
// sources are told in docs/origins.md.
func TestSelfContained(t *testing.T) {
	root := moduleRoot(t)
	walk(t, root, func(rel string) {
		switch filepath.Ext(rel) {
		case ".go", ".c", ".h", ".sh", ".md", ".s":
		default:
			if !strings.HasPrefix(rel, "scripts/") && rel != ".ci/run" {
				return
			}
		}
		fh, err := os.Open(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		defer fh.Close()
		sc := bufio.NewScanner(fh)
		sc.Buffer(nil, 1<<20)
		for line := 1; sc.Scan(); line++ {
			if m := steering.FindString(sc.Text()); m != "" {
				t.Errorf("%s:%d: %q points outside the repository: link into docs/ (docs/origins.md) instead", rel, line, m)
			}
		}
		if err := sc.Err(); err != nil {
			t.Errorf("%s: %v", rel, err)
		}
	})
}
