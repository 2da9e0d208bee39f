package dlock

import (
	"go/doc/comment"
	"go/parser"
	"go/token"
	"regexp"
	"strings"
	"testing"
)

// Every section link in the package documentation (doc.go's "Sections:" line) points at a
// heading the documentation has, so that renaming a heading cannot leave a dead link.
func TestPackageDoc_SectionLinksResolve(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	var p comment.Parser
	d := p.Parse(f.Doc.Text())
	var pr comment.Printer
	html := string(pr.HTML(d))
	ids := map[string]bool{}
	for _, m := range regexp.MustCompile(`<h3 id="([^"]+)">`).FindAllStringSubmatch(html, -1) {
		ids[m[1]] = true
	}
	const base = "https://pkg.go.dev/github.com/dlock-go/dlock#"
	n := 0
	for _, l := range d.Links {
		if !strings.HasPrefix(l.URL, base) {
			continue
		}
		n++
		if id := strings.TrimPrefix(l.URL, base); !ids[id] {
			t.Errorf("[%s] links to #%s, which is no heading of the package documentation", l.Text, id)
		}
		if !l.Used {
			t.Errorf("[%s] is defined but not used", l.Text)
		}
	}
	if n < 15 {
		t.Fatalf("%d section links found, want one per section", n)
	}
}
