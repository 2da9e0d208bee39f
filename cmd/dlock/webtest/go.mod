module github.com/dlock-go/dlock/cmd/dlock/webtest

go 1.26.0

replace github.com/dlock-go/dlock => ../../..

require (
	github.com/chromedp/chromedp v0.23.0
	github.com/dlock-go/dlock v0.1.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/chromedp/cdproto v0.159.0 // indirect
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	github.com/redis/rueidis v1.0.79 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
