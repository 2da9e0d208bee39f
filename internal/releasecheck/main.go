// Command releasecheck proves that the published modules build from outside the repository, as a
// consumer's build sees them once they are tagged: without the in-repo replace directives.
//
// It packs the working tree's root module and each published submodule (dlockprom, dlockotel) into
// a file-based module proxy under a temporary directory, at the versions the release scheme gives
// them (docs/RELEASING.md: every submodule requires the root at the version being released, and is
// tagged with that version under its own path), then builds a consumer module that imports every
// published package with GOFLAGS=-mod=mod and GOPROXY set to that proxy, then to the local module
// cache, and nothing else. A submodule that requires a root version the release would not tag
// (v0.0.0, say) fails the build here, not in a user's.
//
// Usage, from the repository root: go run ./internal/releasecheck
package main

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

const rootPath = "github.com/dlock-go/dlock"

// published are the submodules a release tags beside the root, by directory.
var published = []string{"dlockprom", "dlockotel"}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "releasecheck:", err)
		os.Exit(1)
	}
	fmt.Println("releasecheck: ok")
}

func run() error {
	version, err := releaseVersion()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "dlock-releasecheck-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	proxy := filepath.Join(tmp, "proxy")

	var imports []string
	if err := pack(proxy, rootPath, version, "."); err != nil {
		return err
	}
	for _, dir := range published {
		if err := pack(proxy, rootPath+"/"+dir, version, dir); err != nil {
			return err
		}
		pkgs, err := packages(dir)
		if err != nil {
			return err
		}
		imports = append(imports, pkgs...)
	}
	rootPkgs, err := packages(".")
	if err != nil {
		return err
	}
	imports = append(imports, rootPkgs...)
	return buildConsumer(filepath.Join(tmp, "consumer"), proxy, version, imports)
}

// releaseVersion is the root version every published submodule requires; they must agree, and it
// must be a real release (not the v0.0.0 placeholder a replace directive hides).
func releaseVersion() (string, error) {
	semver := regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`)
	version := ""
	for _, dir := range published {
		v, err := requiredRoot(filepath.Join(dir, "go.mod"))
		if err != nil {
			return "", err
		}
		switch {
		case !semver.MatchString(v):
			return "", fmt.Errorf("%s/go.mod requires %s %s: not a release version", dir, rootPath, v)
		case v == "v0.0.0":
			return "", fmt.Errorf("%s/go.mod requires %s v0.0.0, which no release tags: require the version being released (docs/RELEASING.md)", dir, rootPath)
		case version != "" && v != version:
			return "", fmt.Errorf("%s/go.mod requires %s %s, another submodule %s: every submodule requires the root version released with it", dir, rootPath, v, version)
		}
		version = v
	}
	return version, nil
}

// requiredRoot reads the version of the root module a go.mod requires.
func requiredRoot(gomod string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require "))
		if len(fields) >= 2 && fields[0] == rootPath {
			return fields[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("%s does not require %s", gomod, rootPath)
}

// pack writes module path@version from dir into the proxy's layout: list, .info, .mod and .zip.
// The zip holds what `go mod download` would: the module's files, without nested modules,
// with the repository's LICENSE added when the module has none of its own (as the go command
// does for a module in a repository's subdirectory).
func pack(proxy, path, version, dir string) error {
	at := filepath.Join(proxy, filepath.FromSlash(path), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	info, _ := json.Marshal(map[string]any{"Version": version, "Time": time.Now().UTC().Format(time.RFC3339)})
	files := map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  gomod,
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(at, name), b, 0o644); err != nil {
			return err
		}
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	prefix := path + "@" + version + "/"
	hasLicense := false
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			if rel == "." {
				return nil
			}
			base := d.Name()
			if strings.HasPrefix(base, ".") || base == "vendor" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // a nested module is not part of this one
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if rel == "LICENSE" {
			hasLicense = true
		}
		return addFile(zw, prefix+filepath.ToSlash(rel), p)
	})
	if err != nil {
		return err
	}
	if !hasLicense {
		license := "LICENSE" // this command runs at the repository's root
		if _, err := os.Stat(license); err != nil {
			return fmt.Errorf("module %s has no LICENSE, nor has the repository: %v", path, err)
		}
		if err := addFile(zw, prefix+"LICENSE", license); err != nil {
			return err
		}
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(at, version+".zip"), buf.Bytes(), 0o644)
}

func addFile(zw *zip.Writer, name, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	w, err := zw.Create(name)
	if err != nil {
		return err
	}
	_, err = io.Copy(w, f)
	return err
}

// packages lists the importable (non-main, non-internal) packages of the module in dir.
func packages(dir string) ([]string, error) {
	cmd := exec.Command("go", "list", "-f", "{{if ne .Name \"main\"}}{{.ImportPath}}{{end}}", "./...")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("go list in %s: %v: %s", dir, err, ee.Stderr)
		}
		return nil, err
	}
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		if !strings.Contains(p, "/internal/") && !strings.HasSuffix(p, "/internal") {
			pkgs = append(pkgs, p)
		}
	}
	return pkgs, nil
}

// buildConsumer makes a module outside the repository that imports every published package,
// requires the submodules at the release version, and builds it from the proxy alone.
func buildConsumer(dir, proxy, version string, imports []string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	sort.Strings(imports)
	var src strings.Builder
	src.WriteString("// A consumer of every published dlock package, built outside the repository.\npackage main\n\nimport (\n")
	for _, p := range imports {
		fmt.Fprintf(&src, "\t_ %q\n", p)
	}
	src.WriteString(")\n\nfunc main() {}\n")
	var mod strings.Builder
	mod.WriteString("module example.com/consumer\n\ngo 1.26.0\n\nrequire (\n")
	fmt.Fprintf(&mod, "\t%s %s\n", rootPath, version)
	for _, d := range published {
		fmt.Fprintf(&mod, "\t%s/%s %s\n", rootPath, d, version)
	}
	mod.WriteString(")\n")
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src.String()), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(mod.String()), 0o644); err != nil {
		return err
	}
	// The consumer's go.sum starts as the submodules' own: their dependencies are verified
	// against the hashes this repository already pinned.
	var sums []byte
	for _, d := range append([]string{"."}, published...) {
		b, err := os.ReadFile(filepath.Join(d, "go.sum"))
		if err != nil {
			return err
		}
		sums = append(sums, b...)
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), sums, 0o644); err != nil {
		return err
	}
	env, err := exec.Command("go", "env", "GOMODCACHE", "GOPROXY").Output()
	if err != nil {
		return err
	}
	cache, upstream, _ := strings.Cut(strings.TrimSpace(string(env)), "\n")
	// The published modules come from the file proxy (no other proxy has these versions yet);
	// their dependencies from the local module cache, laid out as a proxy, which this
	// repository's builds have filled, and failing that from the configured proxy (an older
	// go.mod in a dependency's graph, say).
	goproxy := "file://" + filepath.ToSlash(proxy) + ",file://" + filepath.ToSlash(filepath.Join(cache, "cache", "download")) + "," + upstream
	// A module cache of its own: the versions packed here are not real releases, and must
	// neither come from nor land in the machine's cache.
	modcache := filepath.Join(filepath.Dir(dir), "modcache")
	cmd := exec.Command("go", "build", "-o", os.DevNull, ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod -modcacherw -trimpath", "GOPROXY="+goproxy, "GOSUMDB=off", "GONOSUMDB=", "GOPRIVATE=", "GOWORK=off", "GOMODCACHE="+modcache)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("a consumer requiring %s %s and its submodules does not build from outside the repository:\n%s", rootPath, version, out)
	}
	fmt.Printf("releasecheck: a consumer of %d packages builds against %s %s, %s\n", len(imports), rootPath, version, strings.Join(published, ", "))
	return nil
}
