package dlock_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// maxFuncLines is the longest a library function may be: from its func line to its closing
// brace, both counted.
const maxFuncLines = 80

// longFuncsAllowed are functions allowed over maxFuncLines, as "file: Recv.name" (or "file:
// name"); an entry whose function is no longer long fails the test. It is empty: keep it so.
var longFuncsAllowed = map[string]bool{}

// A function of the root package or of internal/ (tests aside) over maxFuncLines lines is hard
// to read as one piece: cut it into helpers named for what they do.
func TestLibrary_FunctionLength(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir("internal", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "testdata" {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	long := make(map[string]int) // "file: name" -> lines
	fset := token.NewFileSet()
	parsed := 0
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		parsed++
		for _, decl := range af.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.Body.Rbrace).Line - fset.Position(fn.Pos()).Line + 1
			if lines > maxFuncLines {
				long[filepath.ToSlash(file)+": "+funcName(fn)] = lines
			}
		}
	}
	if parsed < 50 {
		t.Fatalf("parsed only %d files: is the test running in the module's root?", parsed)
	}
	var names []string
	for name := range long {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !longFuncsAllowed[name] {
			t.Errorf("%s is %d lines, over %d: cut it into helpers named for what they do", name, long[name], maxFuncLines)
		}
	}
	var stale []string
	for name := range longFuncsAllowed {
		if _, ok := long[name]; !ok {
			stale = append(stale, name)
		}
	}
	sort.Strings(stale)
	for _, name := range stale {
		t.Errorf("%s is allowed to be long but is not (or no longer exists): remove it from longFuncsAllowed", name)
	}
}

// funcName is a declared function's name, as Recv.name for a method.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	return recvName(fn.Recv.List[0].Type) + "." + fn.Name.Name
}
