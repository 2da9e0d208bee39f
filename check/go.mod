module github.com/dlock-go/dlock/check

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/dlock-go/dlock v0.0.0
	golang.org/x/sys v0.48.0
)

require github.com/redis/rueidis v1.0.79 // indirect

replace github.com/dlock-go/dlock => ..
