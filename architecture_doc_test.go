package dlock_test

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docs/ARCHITECTURE.md names files and functions to read the code by; a rename that leaves it
// behind makes it a map of code that is not there. The convention it follows (stated at its
// top, "Names in this document"):
//
//   - every Go file (`x.go`) and script (`x.lua`) it names exists: in the root package, in
//     internal/protocol/scripts/ for scripts named alone, or, in a row of the package table,
//     in that row's package;
//   - in the diagrams (the fenced blocks), the names after a Go file of the root package or of
//     an internal package (`internal/backend/batch.go`), up to the next file or the end of the
//     line (`Type.method`, `function`; `Type.a / b` is Type.a and Type.b), are declared in that
//     file;
//   - elsewhere, on a line (a table row) that names such files (a file of a package table row
//     is in the row's package), every backticked Go name (`Name` or `Type.name`, not qualified
//     by another package) is declared in one of those files: a function, a method, a type, a
//     struct field or interface method, a var or a const.
func TestArchitectureDoc_NamesExist(t *testing.T) {
	const doc = "docs/ARCHITECTURE.md"
	decls, imports := rootDecls(t)
	f, err := os.Open(doc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fileRef := regexp.MustCompile(`[A-Za-z0-9_*/]+\.(?:go|lua)\b`)
	backticked := regexp.MustCompile("`([A-Za-z_][A-Za-z0-9_]*(?:\\.[A-Za-z_][A-Za-z0-9_]*)?)`")
	ident := regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?$`)
	exists := func(p string) bool {
		if strings.Contains(p, "*") {
			m, _ := filepath.Glob(p)
			return len(m) > 0
		}
		_, err := os.Stat(p)
		return err == nil
	}
	// declaredIn reports whether name is declared in one of files (paths from the root).
	declaredIn := func(name string, files []string) bool {
		for _, file := range files {
			if decls[file][name] {
				return true
			}
		}
		return false
	}

	sc := bufio.NewScanner(f)
	inFence, n, refs, names := false, 0, 0, 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		where := doc + ":" + strconv.Itoa(n)
		// The package a table row is about: its first cell, when that is a directory.
		dir := "."
		if cells := strings.Split(line, "|"); strings.HasPrefix(line, "|") && len(cells) > 2 {
			if m := regexp.MustCompile("^`([a-z/]+)`").FindStringSubmatch(strings.TrimSpace(cells[1])); m != nil && m[1] != "dlock" && exists(m[1]) {
				dir = m[1]
			}
		}
		var goFiles []string // the files of parsed packages the line names
		locs := fileRef.FindAllStringIndex(line, -1)
		for _, loc := range locs {
			ref := line[loc[0]:loc[1]]
			p := filepath.Join(dir, ref)
			if strings.HasSuffix(ref, ".lua") && !strings.Contains(ref, "/") {
				p = filepath.Join("internal", "protocol", "scripts", ref)
			}
			refs++
			if !exists(p) {
				t.Errorf("%s names %s, which does not exist (%s)", where, ref, p)
				continue
			}
			if decls[p] != nil {
				goFiles = append(goFiles, p)
			}
		}
		if len(goFiles) == 0 {
			continue
		}
		if inFence {
			// The names after each root file, up to the next file.
			for i, loc := range locs {
				ref := filepath.Join(dir, line[loc[0]:loc[1]])
				if decls[ref] == nil {
					continue
				}
				end := len(line)
				if i+1 < len(locs) {
					end = locs[i+1][0]
				}
				recv := ""
				for _, tok := range strings.FieldsFunc(line[loc[1]:end], func(r rune) bool {
					return r == ' ' || r == '/' || r == ';' || r == ',' || r == '(' || r == ')' || r == '→'
				}) {
					if !ident.MatchString(tok) {
						break // prose, not a name
					}
					if r, _, ok := strings.Cut(tok, "."); ok {
						recv = r
					} else if recv != "" {
						tok = recv + "." + tok // "renewer.run / next": renewer.next
					}
					names++
					if !decls[ref][tok] {
						t.Errorf("%s: %s declares no %s", where, ref, tok)
					}
				}
			}
			continue
		}
		for _, m := range backticked.FindAllStringSubmatch(line, -1) {
			name := m[1]
			if strings.HasSuffix(name, ".go") || strings.HasSuffix(name, ".lua") {
				continue
			}
			if q, _, ok := strings.Cut(name, "."); ok && imports[q] {
				continue // another package's name (conn.Conn)
			}
			names++
			if !declaredIn(name, goFiles) {
				t.Errorf("%s names `%s` beside %s, and none of them declares it", where, name, strings.Join(goFiles, ", "))
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if refs < 50 || names < 50 {
		t.Fatalf("%s: found %d file references and %d names, fewer than it holds: is the convention still followed?", doc, refs, names)
	}
}

// rootDecls parses the files (not the tests) of the root package and of the internal packages,
// and returns, per file (its path from the root), the names it declares: functions, types,
// vars, consts as Name, methods as Recv.Name and Name, struct fields and interface methods as
// Type.name; and the names of the packages the files import.
func rootDecls(t *testing.T) (map[string]map[string]bool, map[string]bool) {
	t.Helper()
	var files []string
	for _, pattern := range []string{"*.go", "internal/*/*.go"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	decls := make(map[string]map[string]bool)
	imports := map[string]bool{"dlock": true}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		d := make(map[string]bool)
		decls[file] = d
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			name := path.Base(p)
			if im.Name != nil {
				name = im.Name.Name
			}
			imports[name] = true
		}
		for _, decl := range af.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				d[decl.Name.Name] = true
				if decl.Recv != nil && len(decl.Recv.List) > 0 {
					d[recvName(decl.Recv.List[0].Type)+"."+decl.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						d[spec.Name.Name] = true
						var fields *ast.FieldList
						switch ty := spec.Type.(type) {
						case *ast.StructType:
							fields = ty.Fields
						case *ast.InterfaceType:
							fields = ty.Methods
						}
						if fields != nil {
							for _, fl := range fields.List {
								for _, nm := range fl.Names {
									d[spec.Name.Name+"."+nm.Name] = true
								}
							}
						}
					case *ast.ValueSpec:
						for _, nm := range spec.Names {
							d[nm.Name] = true
						}
					}
				}
			}
		}
	}
	return decls, imports
}

// recvName is the type name of a method's receiver: T for T, *T, T[P] or *T[P].
func recvName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.StarExpr:
		return recvName(e.X)
	case *ast.IndexExpr:
		return recvName(e.X)
	case *ast.IndexListExpr:
		return recvName(e.X)
	case *ast.Ident:
		return e.Name
	}
	return ""
}
