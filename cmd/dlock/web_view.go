package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/rueidisconn"
)

// What the watcher keeps, bounded whatever the server holds.
const (
	maxEvents     = 1000  // history entries kept (the oldest go first)
	maxHoldNames  = 10000 // lock names whose hold times are kept
	holdsPerName  = 64    // hold times kept per name
	listTimeout   = 10 * time.Second
	noticeBackoff = 5 * time.Second  // longest pause before subscribing again
	deniedBackoff = 30 * time.Second // pause when the server refuses the subscription
	inspectLimit  = 5 * time.Second  // one Inspect of a lock just granted
)

// Folding a hot lock's history: a lock handed on again and again (acquired, released, granted
// to a queued client: the handoffs) would push every other entry out of the history, so its
// consecutive handoffs become one entry that counts them, and the rare entries (a lease that
// ran out, a force-unlock) stay in view.
const (
	foldMin    = 6                // handoffs of one name within foldStart that start a fold
	foldStart  = 2 * time.Second  //
	foldGap    = 10 * time.Second // a pause this long ends a fold: the next handoff is an entry of its own
	foldRecent = 10               // seconds of per-second counts a fold entry carries
	maxFolds   = 1000             // names with a fold or recent handoffs kept; the stale go first
)

// The states of the release-notice subscription (webView.notices); any other value says why
// there is none.
const (
	noticesLive       = "live"
	noticesConnecting = "connecting"
)

// Kinds of history entries.
const (
	evAcquired   = "acquired"
	evReleased   = "released"
	evGranted    = "granted"
	evExpired    = "expired"
	evGone       = "gone"
	evForced     = "force-unlocked"
	evHolderGone = "holder-not-running"
	evHandoffs   = "handoffs" // a fold of one lock's consecutive handoffs (webFold)
)

// isHandoff reports whether an entry of kind is one of the handoffs a fold counts.
func isHandoff(kind string) bool {
	return kind == evAcquired || kind == evReleased || kind == evGranted
}

// webEvent is one entry of a lock's history as the page shows it.
type webEvent struct {
	Seq  uint64 `json:"seq"`
	Time string `json:"time"` // when this server saw it (RFC 3339, this host's clock)
	Name string `json:"name"` // as JSON text: bytes that are not UTF-8 become U+FFFD
	// NameB64 is the name's exact bytes, standard base64: what the unlock endpoint takes.
	NameB64 string   `json:"name_b64"`
	Kind    string   `json:"kind"`
	Token   uint64   `json:"token"`
	Holder  string   `json:"holder,omitempty"`
	HoldMs  *int64   `json:"hold_ms,omitempty"` // for the end of a hold: how long it was held
	HoldUs  *int64   `json:"hold_us,omitempty"` // the same in microseconds
	Detail  string   `json:"detail,omitempty"`
	Fold    *webFold `json:"fold,omitempty"` // kind "handoffs" only
}

// webFold is an entry of kind "handoffs": a run of one lock's handoffs folded into one entry.
// While the run goes on, the entry is sent again (with a new seq) at every handoff; the page
// replaces the copy it had (same ID) and drops the separate entries the fold took in (that
// name's handoffs from FirstSeq on). Time, Token and Holder are the last handoff's.
type webFold struct {
	ID       uint64 `json:"id"`        // the same for every copy of the fold
	FirstSeq uint64 `json:"first_seq"` // the seq of the first handoff it took in
	// Count is the handoffs in the fold: the holds it saw change hands. A release and the grant
	// of the lock to the next holder are one handoff; so are a release and the next acquisition.
	Count int            `json:"count"`
	Since string         `json:"since"` // when the first was seen (RFC 3339)
	Kinds map[string]int `json:"kinds"` // the count of the entries of each kind it took in
	// Recent counts the handoffs of each second before Time: Recent[0] the second up to Time,
	// Recent[1] the one before, and so on (foldRecent seconds).
	Recent []int `json:"recent"`
}

// foldState is a fold while it takes in handoffs.
type foldState struct {
	seq   uint64 // the seq of its entry now in the history
	ev    webEvent
	times []time.Time // its handoffs of the last foldRecent seconds
	last  time.Time
	kind  string // of the last entry it took in
}

// add counts an entry of kind seen at in the fold.
func (f *foldState) add(kind string, at time.Time) {
	f.ev.Fold.Kinds[kind]++
	if kind == evReleased || f.kind != evReleased { // else the second half of a handoff
		f.ev.Fold.Count++
		f.times = append(f.times, at)
	}
	f.kind = kind
}

// handoffMark is a handoff entry not (yet) in a fold.
type handoffMark struct {
	seq  uint64
	at   time.Time
	kind string
}

// watched is a held lock as the watcher last saw it.
type watched struct {
	info   dlock.Info
	readAt time.Time // this host's clock when info was read (listing) or learnt (notice)
}

// goneMark is a release the watcher heard: a listing that began before at may still show the
// lock held with a token up to token, and is not believed.
type goneMark struct {
	token uint64
	at    time.Time
}

// watcher keeps the server-side view of the locks for dlock web: a listing every interval
// (Client.List) and the release notices of every lock under the key prefix (one pattern
// subscription), turned into the current locks and their history while it runs.
type watcher struct {
	c          *dlock.Client
	keyPrefix  string
	prefix     string // name prefix
	interval   time.Duration
	kick       chan struct{} // capacity 1: list again soon (notices were missed)
	inspectNow chan struct{} // capacity 1: a lock is to be read (pending has its name)
	noticeStop context.CancelFunc
	noticeDone chan struct{}

	mu            sync.Mutex
	locks         map[string]*watched
	vanished      map[string]watched  // gone from a listing without a notice; judged at the next one
	gone          map[string]goneMark // releases heard
	forcing       map[string]int      // force-unlocks from the page under way
	deadNoted     map[string]uint64   // token whose holder was reported not running
	holdTimes     map[string][]time.Duration
	events        []webEvent
	seq           uint64
	folds         map[string]*foldState    // the hot locks' folds under way
	handoffs      map[string][]handoffMark // each name's latest handoff entries, outside a fold
	pending       map[string]bool          // locks to read (inspectGrants): granted (false), or again for an election (true)
	readAt        time.Time                // last successful listing (start)
	err           error                    // last listing's error
	offset        time.Duration
	notices       string
	rc            rueidis.Client // for the subscription and TIME; nil until dialled
	subs          map[chan struct{}]struct{}
	refreshes     uint64
	refreshErrors uint64
	noticeCount   uint64
}

func newWatcher(c *dlock.Client, keyPrefix, prefix string, interval time.Duration) *watcher {
	return &watcher{
		c: c, keyPrefix: keyPrefix, prefix: prefix, interval: interval,
		kick:       make(chan struct{}, 1),
		inspectNow: make(chan struct{}, 1),
		folds:      make(map[string]*foldState),
		handoffs:   make(map[string][]handoffMark),
		pending:    make(map[string]bool),
		locks:      make(map[string]*watched),
		vanished:   make(map[string]watched),
		gone:       make(map[string]goneMark),
		forcing:    make(map[string]int),
		deadNoted:  make(map[string]uint64),
		holdTimes:  make(map[string][]time.Duration),
		notices:    noticesConnecting,
		subs:       make(map[chan struct{}]struct{}),
	}
}

// webView is a copy of the watcher's state at one moment.
type webView struct {
	now                                   time.Time
	locks                                 []viewLock // by name
	readAt                                time.Time
	err                                   error
	offset                                time.Duration // server clock − this host's
	notices                               string
	refreshes, refreshErrors, noticeCount uint64
}

type viewLock struct {
	info   dlock.Info
	readAt time.Time
	holds  []time.Duration
}

// current is the lock with its remaining lease counted down to now (a renewal since the read
// is not known until the next one).
func (l viewLock) current(now time.Time) dlock.Info {
	i := l.info
	i.TTL = max(i.TTL-now.Sub(l.readAt), 0).Truncate(time.Millisecond)
	return i
}

func (w *watcher) view() webView {
	w.mu.Lock()
	defer w.mu.Unlock()
	v := webView{
		now: time.Now(), readAt: w.readAt, err: w.err, offset: w.offset, notices: w.notices,
		refreshes: w.refreshes, refreshErrors: w.refreshErrors, noticeCount: w.noticeCount,
		locks: make([]viewLock, 0, len(w.locks)),
	}
	for name, l := range w.locks {
		v.locks = append(v.locks, viewLock{info: l.info, readAt: l.readAt, holds: append([]time.Duration(nil), w.holdTimes[name]...)})
	}
	sort.Slice(v.locks, func(i, j int) bool { return v.locks[i].info.Name < v.locks[j].info.Name })
	return v
}

// eventsAfter returns the history entries after seq.
func (w *watcher) eventsAfter(seq uint64) []webEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	i := sort.Search(len(w.events), func(i int) bool { return w.events[i].Seq > seq })
	return append([]webEvent(nil), w.events[i:]...)
}

// subscribe returns a channel that receives a signal (capacity 1) after every change.
func (w *watcher) subscribe() chan struct{} {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	w.subs[ch] = struct{}{}
	w.mu.Unlock()
	return ch
}

func (w *watcher) unsubscribe(ch chan struct{}) {
	w.mu.Lock()
	delete(w.subs, ch)
	w.mu.Unlock()
}

// changed signals the subscribers; w.mu is held.
func (w *watcher) changed() {
	for ch := range w.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// run lists the locks every interval, and sooner (but never within minRefreshGap of the last
// listing) when kicked, until ctx ends.
func (w *watcher) run(ctx context.Context) {
	inspected := make(chan struct{})
	go func() {
		defer close(inspected)
		w.inspectGrants(ctx)
	}()
	defer func() { <-inspected }()
	t := time.NewTimer(w.interval)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.kick:
			if d := minRefreshGap - time.Since(last); d > 0 {
				t.Reset(d)
				continue
			}
		}
		last = time.Now()
		w.refresh(ctx)
		t.Reset(w.interval)
	}
}

// inspectGrants reads the locks granted to a queued client, until ctx ends. A grant's notice
// names the new token and queue entry, not the holder: until the lock is read again the page
// would show no holder. One Inspect of that lock tells, far cheaper than listing them all,
// and a lock granted again before its turn is read once, with its latest holder.
func (w *watcher) inspectGrants(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.inspectNow:
		}
		w.mu.Lock()
		names := w.pending
		w.pending = make(map[string]bool)
		w.mu.Unlock()
		for name, again := range names {
			start := time.Now()
			ictx, cancel := context.WithTimeout(ctx, inspectLimit)
			info, err := w.c.Inspect(ictx, name)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if again {
				w.learnLeader(name, info, err, start)
			} else {
				w.learnHolder(name, info, err, start)
			}
		}
	}
}

// learnHolder takes an Inspect of name begun at start: it fills in the holder of a lock the
// watcher knows only from a grant's notice, when the token is still the grant's.
func (w *watcher) learnHolder(name string, info dlock.Info, err error, start time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.kickRefresh() // the next listing tells
		return
	}
	l := w.locks[name]
	if l == nil || !info.Held || info.Token != l.info.Token || l.info.Holder != (dlock.Holder{}) {
		return // changed since (a notice or a listing tells of it), or known already
	}
	w.locks[name] = &watched{info: info, readAt: start}
	if f := w.folds[name]; f != nil && f.ev.Token == info.Token && f.ev.Holder == "" {
		f.ev.Holder = shortHolder(info.Holder) // shown with the fold's next copy
	}
	w.changed()
}

// learnLeader takes an Inspect of name begun at start, read because its election announced a
// term or a new value ("l <token>"): the lock as read replaces the one known, unless a notice
// or a listing since told of a later holder. A new term's lock passed on without a notice the
// watcher hears (a grant goes to the new leader's client alone): the former hold ends here.
func (w *watcher) learnLeader(name string, info dlock.Info, err error, start time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.kickRefresh() // the next listing tells
		return
	}
	if !info.Held || info.Kind != dlock.KindMutex {
		return // gone again: its release notice, or the next listing, tells
	}
	if g, ok := w.gone[name]; ok && info.Token <= g.token {
		return // released since
	}
	prev := w.locks[name]
	switch {
	case prev != nil && info.Token < prev.info.Token:
		return // a later holder is known
	case prev != nil && info.Token == prev.info.Token:
		// The same term: its value (Proclaim), or its holder (a grant's notice came first).
	case prev != nil:
		w.endHold(name, prev.info, start, evReleased, "", true)
		w.addEvent(webEvent{Name: name, Kind: evAcquired, Token: info.Token, Holder: shortHolder(info.Holder), Detail: leaderDetail(info)})
	default:
		if v, ok := w.vanished[name]; ok {
			delete(w.vanished, name)
			if v.info.Token != info.Token {
				w.endHold(name, v.info, start, evReleased, "", true)
			}
		}
		w.addEvent(webEvent{Name: name, Kind: evAcquired, Token: info.Token, Holder: shortHolder(info.Holder), Detail: leaderDetail(info)})
	}
	w.locks[name] = &watched{info: info, readAt: start}
	if f := w.folds[name]; f != nil && f.ev.Token == info.Token && f.ev.Holder == "" {
		f.ev.Holder = shortHolder(info.Holder)
	}
	w.changed()
}

// leaderDetail is what a history entry says of a lock taken by an election's leader.
func leaderDetail(info dlock.Info) string {
	if info.Leader == nil {
		return ""
	}
	return "leads the election: " + strconv.Quote(info.Leader.Value)
}

func (w *watcher) kickRefresh() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// refresh lists the locks and merges the listing into the view.
func (w *watcher) refresh(ctx context.Context) error {
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, listTimeout)
	infos, err := w.c.List(lctx, w.prefix)
	cancel()
	w.measureOffset(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	defer w.changed()
	w.refreshes++
	if err != nil {
		w.refreshErrors++
		w.err = err
		return err
	}
	w.err = nil
	w.readAt = start
	w.merge(infos, start)
	return nil
}

// merge takes a listing begun at start; w.mu is held.
func (w *watcher) merge(infos []dlock.Info, start time.Time) {
	now := time.Now()
	// What vanished at an earlier listing and was not explained by a notice since: the lease
	// ran out (or, without notices, an unheard release).
	for name, v := range w.vanished {
		if !v.readAt.Before(start) {
			continue
		}
		delete(w.vanished, name)
		switch {
		case v.info.Kind != dlock.KindMutex:
			w.endHold(name, v.info, v.readAt, evGone, sharedEnd, false)
		case w.notices == noticesLive:
			w.endHold(name, v.info, v.readAt, evExpired, "no release notice: its lease ran out (the holder stopped renewing it: it crashed, stalled or lost the server)", false)
		default:
			w.endHold(name, v.info, v.readAt, evGone, "released or expired: release notices are not heard ("+w.notices+")", false)
		}
	}
	seen := make(map[string]bool, len(infos))
	for _, info := range infos {
		name := info.Name
		if g, ok := w.gone[name]; ok && info.Token <= g.token {
			continue // read before a release this watcher heard
		}
		seen[name] = true
		prev := w.locks[name]
		if prev != nil && info.Kind == dlock.KindMutex && (info.Token < prev.info.Token ||
			prev.readAt.After(start) && (info.Token != prev.info.Token || prev.info.Leader != nil)) {
			// A notice since the listing began told of a newer holder (tokens only grow), or
			// of a leader's newer value (read after the listing began).
			continue
		}
		switch {
		case prev == nil:
			if v, ok := w.vanished[name]; ok {
				delete(w.vanished, name)
				if v.info.Token == info.Token {
					break // back: the listing missed it (SCAN may, while keys change)
				}
				w.endHold(name, v.info, start, evGone, "changed hands between two listings; no release notice heard", false)
			}
			w.addEvent(webEvent{Name: name, Kind: evAcquired, Token: info.Token, Holder: shortHolder(info.Holder)})
		case prev.info.Token != info.Token && info.Kind == dlock.KindMutex:
			w.endHold(name, prev.info, start, evGone, "changed hands between two listings; no release notice heard", false)
			w.addEvent(webEvent{Name: name, Kind: evAcquired, Token: info.Token, Holder: shortHolder(info.Holder)})
		}
		w.locks[name] = &watched{info: info, readAt: start}
		if alive, why := holderAlive(info); alive != nil && !*alive && w.deadNoted[name] != info.Token {
			w.deadNoted[name] = info.Token
			w.addEvent(webEvent{Name: name, Kind: evHolderGone, Token: info.Token, Holder: shortHolder(info.Holder),
				Detail: fmt.Sprintf("%s; the lock frees when its lease runs out (%s)", why, info.TTL.Truncate(time.Millisecond))})
		}
	}
	for name, l := range w.locks {
		if seen[name] || l.readAt.After(start) { // learnt from a notice after the listing began
			continue
		}
		delete(w.locks, name)
		w.vanished[name] = watched{info: l.info, readAt: now}
	}
	for name, g := range w.gone {
		if g.at.Before(start) {
			delete(w.gone, name)
		}
	}
	for name := range w.deadNoted {
		if w.locks[name] == nil {
			delete(w.deadNoted, name)
		}
	}
}

// sharedEnd is the history's word for a read-write lock or semaphore no longer held: they
// announce grants but not releases, so the watcher sees them go at a listing, and cannot tell
// a release from a lease that ran out.
const sharedEnd = "no longer held at the last listing: released or expired (read-write locks and semaphores announce no release)"

// heldSince is when the hold of info that the page shows began, on the server's clock, when
// the listing tells: from a lock's or a writer's token, or a semaphore's oldest holder's
// (tokens are the server's clock at the acquisition). A read-write lock held by readers alone
// has the last writer's token, which says nothing of when they came: unknown.
//
// A read-write lock or semaphore is one row however many holders come and go: the page
// records when it is first seen held and when it is seen free, not each holder's turn.
func heldSince(info dlock.Info) (time.Time, bool) {
	switch {
	case info.Kind == dlock.KindSemaphore && info.Shared != nil && len(info.Shared.Holders) > 0:
		oldest := info.Shared.Holders[0].Token
		for _, h := range info.Shared.Holders[1:] {
			oldest = min(oldest, h.Token)
		}
		return dlock.Info{Token: oldest}.TokenTime(), oldest != 0
	case info.Kind == dlock.KindRWMutex && (info.Shared == nil || !info.Shared.Writer):
		return time.Time{}, false
	}
	return info.TokenTime(), info.Token != 0
}

// endHold records the end of a hold of name seen at (this host's clock) as an event of the
// given kind; with timed, its duration counts in the lock's typical hold time.
func (w *watcher) endHold(name string, info dlock.Info, at time.Time, kind, detail string, timed bool) {
	ev := webEvent{Name: name, Kind: kind, Token: info.Token, Holder: shortHolder(info.Holder), Detail: detail}
	if since, ok := heldSince(info); ok && info.Kind == dlock.KindMutex {
		held := max(at.Add(w.offset).Sub(since), 0)
		ms, us := held.Milliseconds(), held.Microseconds()
		ev.HoldMs, ev.HoldUs = &ms, &us
		if timed {
			w.addHold(name, held)
		}
	}
	w.addEvent(ev)
}

func (w *watcher) addHold(name string, d time.Duration) {
	h, ok := w.holdTimes[name]
	if !ok && len(w.holdTimes) >= maxHoldNames {
		for n := range w.holdTimes { // drop one, whichever
			if w.locks[n] == nil {
				delete(w.holdTimes, n)
				break
			}
		}
	}
	if len(h) >= holdsPerName {
		h = h[1:]
	}
	w.holdTimes[name] = append(h, d)
}

// addEvent adds ev to the history, folding a hot lock's handoffs (see foldMin); w.mu is held.
func (w *watcher) addEvent(ev webEvent) {
	now := time.Now()
	name := ev.Name
	if !isHandoff(ev.Kind) { // a rare entry: of its own, and it ends the name's fold
		delete(w.folds, name)
		delete(w.handoffs, name)
		w.appendEvent(ev, now)
		return
	}
	if f := w.folds[name]; f != nil {
		if now.Sub(f.last) < foldGap {
			w.joinFold(f, ev, now)
			return
		}
		delete(w.folds, name)
	}
	marks := w.handoffs[name]
	for len(marks) > 0 && now.Sub(marks[0].at) > foldStart {
		marks = marks[1:]
	}
	if len(marks)+1 < foldMin {
		seq := w.appendEvent(ev, now)
		w.handoffs[name] = append(marks, handoffMark{seq: seq, at: now, kind: ev.Kind})
		if len(w.handoffs) > maxFolds {
			w.sweepFolds(now)
		}
		return
	}
	// Hot: the entries of the latest handoffs and this one become one fold.
	delete(w.handoffs, name)
	f := &foldState{ev: webEvent{Name: name, Kind: evHandoffs, Fold: &webFold{
		ID: marks[0].seq, FirstSeq: marks[0].seq, Since: marks[0].at.UTC().Format(time.RFC3339Nano), Kinds: make(map[string]int),
	}}}
	for _, m := range marks {
		w.removeEvent(m.seq)
		f.add(m.kind, m.at)
	}
	w.folds[name] = f
	if len(w.folds) > maxFolds {
		w.sweepFolds(now)
	}
	w.joinFold(f, ev, now)
}

// joinFold counts ev in the fold f, whose entry moves to the end of the history; w.mu is held.
func (w *watcher) joinFold(f *foldState, ev webEvent, now time.Time) {
	fd := f.ev.Fold
	f.add(ev.Kind, now)
	f.last = now
	i := 0
	for i < len(f.times) && now.Sub(f.times[i]) >= foldRecent*time.Second {
		i++
	}
	f.times = f.times[i:]
	fd.Recent = make([]int, foldRecent)
	for _, t := range f.times {
		if b := int(now.Sub(t) / time.Second); b >= 0 && b < foldRecent {
			fd.Recent[b]++
		}
	}
	f.ev.Token = ev.Token
	if ev.Holder != "" || ev.Kind != evReleased {
		f.ev.Holder = ev.Holder // a release names the holder that left; a grant's is read later
	}
	if f.seq != 0 {
		w.removeEvent(f.seq)
	}
	// A copy: the fold goes on changing, the history's entries do not.
	cp := f.ev
	fc := *fd
	fc.Kinds = make(map[string]int, len(fd.Kinds))
	for k, n := range fd.Kinds {
		fc.Kinds[k] = n
	}
	cp.Fold = &fc
	f.seq = w.appendEvent(cp, now)
}

// sweepFolds forgets the folds and handoff marks gone stale, and any over maxFolds; w.mu is held.
func (w *watcher) sweepFolds(now time.Time) {
	for name, f := range w.folds {
		if now.Sub(f.last) >= foldGap || len(w.folds) > maxFolds {
			delete(w.folds, name)
		}
	}
	for name, m := range w.handoffs {
		if len(m) == 0 || now.Sub(m[len(m)-1].at) > foldStart || len(w.handoffs) > maxFolds {
			delete(w.handoffs, name)
		}
	}
}

// appendEvent appends ev to the history with the next seq, and returns it; w.mu is held.
func (w *watcher) appendEvent(ev webEvent, now time.Time) uint64 {
	w.seq++
	ev.Seq = w.seq
	ev.Time = now.UTC().Format(time.RFC3339Nano)
	ev.NameB64 = b64Name(ev.Name)
	if len(w.events) >= maxEvents {
		w.events = append(w.events[:0:0], w.events[len(w.events)-maxEvents+1:]...)
	}
	w.events = append(w.events, ev)
	return ev.Seq
}

// removeEvent removes the entry seq from the history, if it is still there; w.mu is held.
func (w *watcher) removeEvent(seq uint64) {
	i := sort.Search(len(w.events), func(i int) bool { return w.events[i].Seq >= seq })
	if i < len(w.events) && w.events[i].Seq == seq {
		w.events = append(w.events[:i], w.events[i+1:]...)
	}
}

func median(d []time.Duration) (time.Duration, bool) {
	if len(d) == 0 {
		return 0, false
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2], true
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2, true
}

// notice takes a message of a release channel (docs/PROTOCOL.md, "Release notices"): "<token>"
// when the lock became free, "g <token> <entry id> <window ms>" when it was granted to the
// first client of its queue, "l <token>" when an election's leader began its term or changed
// its value (the lock is then read again: see learnLeader).
func (w *watcher) notice(channel, payload string) {
	now := time.Now()
	key, ok := strings.CutSuffix(channel, ":rel")
	if !ok {
		return
	}
	name, ok := lockNameOfKey(w.keyPrefix, key)
	if !ok || !strings.HasPrefix(name, w.prefix) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	prev := w.locks[name]
	if rest, ok := strings.CutPrefix(payload, "l "); ok {
		token, err := strconv.ParseUint(rest, 10, 64)
		if err != nil || token == 0 {
			return
		}
		w.noticeCount++
		if prev != nil && prev.info.Token > token || w.gone[name].token >= token {
			return // a term that has ended already
		}
		w.pending[name] = true
		select {
		case w.inspectNow <- struct{}{}:
		default:
		}
		return
	}
	if rest, ok := strings.CutPrefix(payload, "g "); ok {
		f := strings.Fields(rest)
		if len(f) < 3 {
			return
		}
		token, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil || token == 0 {
			return
		}
		w.noticeCount++
		if prev != nil && prev.info.Token >= token {
			return
		}
		window, _ := strconv.ParseInt(f[2], 10, 64)
		next := dlock.Info{Name: name, Held: true, Token: token, Holds: 1, TTL: time.Duration(window) * time.Millisecond, Waiters: -1}
		if prev != nil {
			w.endHold(name, prev.info, now, evReleased, "", true)
			if prev.info.Waiters >= 0 {
				next.Waiters = max(prev.info.Waiters-1, 0) // the granted client waits no more
			}
		} else if v, ok := w.vanished[name]; ok && v.info.Token < token {
			delete(w.vanished, name)
			w.endHold(name, v.info, now, evReleased, "", true)
		}
		w.locks[name] = &watched{info: next, readAt: now}
		w.addEvent(webEvent{Name: name, Kind: evGranted, Token: token, Detail: "granted to the first client in its queue"})
		if _, ok := w.pending[name]; !ok {
			w.pending[name] = false // to learn the new holder
		}
		select {
		case w.inspectNow <- struct{}{}:
		default:
		}
		w.changed()
		return
	}
	token, err := strconv.ParseUint(payload, 10, 64)
	if err != nil || token == 0 { // 0: the permission probe of a client being made
		return
	}
	w.noticeCount++
	kind, detail := evReleased, ""
	if w.forcing[name] > 0 {
		kind, detail = evForced, "from this page"
	}
	switch v, vanished := w.vanished[name]; {
	case prev != nil && token >= prev.info.Token:
		delete(w.locks, name)
		w.endHold(name, prev.info, now, kind, detail, true)
	case prev != nil:
		return // a notice of an earlier holder, late
	case vanished && token >= v.info.Token:
		delete(w.vanished, name)
		w.endHold(name, v.info, now, kind, detail, true)
	case w.gone[name].token >= token:
		return // heard already
	default:
		w.endHold(name, dlock.Info{Name: name, Token: token}, now, kind, "taken and released between two listings", true)
	}
	w.gone[name] = goneMark{token: token, at: now}
	w.changed()
}

// errChanged: the page asked to force-unlock a lock that has changed hands since it saw it.
var errChanged = errors.New("dlock: the lock changed hands")

// forceUnlock releases name for the page, if it is still held with token (0: whoever holds
// it). The token check and the release are two steps: a hand-over between them is released.
func (w *watcher) forceUnlock(ctx context.Context, name string, token uint64) (dlock.Info, error) {
	if token != 0 {
		cur, err := w.c.Inspect(ctx, name)
		if err != nil {
			return cur, err
		}
		if !cur.Held {
			return cur, fmt.Errorf("%w: %q is free", dlock.ErrNotHeld, name)
		}
		if cur.Token != token {
			return cur, fmt.Errorf("%w: %q has token %d now, not %d (held by %s); nothing released", errChanged, name, cur.Token, token, holderText(cur.Holder))
		}
	}
	w.mu.Lock()
	w.forcing[name]++
	w.mu.Unlock()
	info, err := w.c.ForceUnlock(ctx, name)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.forcing[name]--; w.forcing[name] <= 0 {
		delete(w.forcing, name)
	}
	if err != nil {
		return info, err
	}
	if w.gone[name].token < info.Token { // the notice was not heard (yet)
		if prev := w.locks[name]; prev != nil && prev.info.Token <= info.Token {
			delete(w.locks, name)
		}
		delete(w.vanished, name)
		w.endHold(name, info, time.Now(), evForced, "from this page", true)
		w.gone[name] = goneMark{token: info.Token, at: time.Now()}
		w.changed()
	}
	return info, nil
}

// shortHolder is a holder as a history entry names it: "host pid N (label)"; empty when unknown.
func shortHolder(h dlock.Holder) string {
	if h == (dlock.Holder{}) {
		return ""
	}
	s := fmt.Sprintf("%s pid %d", orDash(h.Host), h.PID)
	if h.Label != "" {
		s += " (" + h.Label + ")"
	}
	return s
}

// lockNameOfKey returns the name of the lock whose key under prefix is key (docs/PROTOCOL.md:
// <prefix>{<tag>}, the tag being the name, or "{" + name for a name that starts with a brace).
func lockNameOfKey(prefix, key string) (string, bool) {
	tag, ok := strings.CutPrefix(key, prefix+"{")
	if !ok {
		return "", false
	}
	tag, ok = strings.CutSuffix(tag, "}")
	if !ok || tag == "" || tag[0] == '}' {
		return "", false
	}
	if tag[0] == '{' {
		name := tag[1:]
		if name == "" || (name[0] != '{' && name[0] != '}') {
			return "", false
		}
		return name, true
	}
	return tag, true
}

// measureOffset reads the server's clock (TIME) to date hold times: lock tokens are the
// server's clock at acquisition. Without a connection, or when TIME fails, the last offset stays.
func (w *watcher) measureOffset(ctx context.Context) {
	w.mu.Lock()
	rc := w.rc
	w.mu.Unlock()
	if rc == nil {
		return
	}
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	t0 := time.Now()
	f, err := rc.Do(tctx, rc.B().Time().Build()).AsStrSlice()
	t1 := time.Now()
	if err != nil || len(f) != 2 {
		return
	}
	sec, err1 := strconv.ParseInt(f[0], 10, 64)
	usec, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return
	}
	server := time.Unix(sec, usec*1000)
	w.mu.Lock()
	w.offset = server.Sub(t0.Add(t1.Sub(t0) / 2))
	w.mu.Unlock()
}

// startNotices subscribes to the release notices in the background (stopNotices ends it).
func (w *watcher) startNotices(ctx context.Context, url string) {
	ctx, w.noticeStop = context.WithCancel(ctx)
	w.noticeDone = make(chan struct{})
	go func() {
		defer close(w.noticeDone)
		w.listenNotices(ctx, url)
	}()
}

func (w *watcher) stopNotices() {
	if w.noticeStop == nil {
		return
	}
	w.noticeStop()
	<-w.noticeDone
	w.mu.Lock()
	rc := w.rc
	w.rc = nil
	w.mu.Unlock()
	if rc != nil {
		rc.Close()
	}
}

func (w *watcher) setNotices(state string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.notices != state {
		w.notices = state
		w.changed()
	}
}

// noticePattern is the one pattern subscription: every channel under the key prefix (the
// release channels are the only ones). An ACL channel rule allows a pattern only when it is
// the same text, and the rule of docs/SECURITY.md is "&<prefix>*".
func (w *watcher) noticePattern() string { return globQuote(w.keyPrefix) + "*" }

// listenNotices keeps the pattern subscription up until ctx ends.
func (w *watcher) listenNotices(ctx context.Context, url string) {
	backoff := time.Duration(0)
	for {
		err := w.listenOnce(ctx, url)
		if ctx.Err() != nil {
			return
		}
		pause := min(max(2*backoff, 100*time.Millisecond), noticeBackoff)
		backoff = pause
		var state string
		switch msg := errText(err); {
		case errors.Is(err, errClusterNotices):
			w.setNotices("unavailable: " + err.Error())
			return
		case strings.Contains(msg, "NOPERM"):
			state = "unavailable: the server refuses PSUBSCRIBE " + w.noticePattern() + " to this user (add +psubscribe +punsubscribe to its ACL rule, docs/SECURITY.md); releases show at the next listing"
			pause = deniedBackoff
		default:
			state = "reconnecting: " + msg
		}
		w.setNotices(state)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

var errClusterNotices = errors.New("a Redis Cluster announces releases with sharded pub/sub, which has no pattern subscriptions; releases show at the next listing")

func errText(err error) string {
	if err == nil {
		return "connection closed"
	}
	return oneLine(err)
}

// listenOnce subscribes once and returns when the subscription ends.
func (w *watcher) listenOnce(ctx context.Context, url string) error {
	w.mu.Lock()
	rc := w.rc
	w.mu.Unlock()
	if rc == nil {
		opt, err := rueidisconn.ParseURL(url)
		if err != nil {
			return err
		}
		opt.DisableCache = true
		opt.Dialer.Timeout = dialTimeout
		rc, err = rueidis.NewClient(opt)
		if err != nil {
			return err
		}
		w.mu.Lock()
		w.rc = rc
		w.mu.Unlock()
	}
	if rc.Mode() == rueidis.ClientModeCluster {
		return errClusterNotices
	}
	dc, release := rc.Dedicate()
	defer release()
	defer dc.Close()
	lost := dc.SetPubSubHooks(rueidis.PubSubHooks{
		OnMessage: func(m rueidis.PubSubMessage) { w.notice(m.Channel, m.Message) },
		OnSubscription: func(s rueidis.PubSubSubscription) {
			if s.Kind == "psubscribe" {
				w.setNotices(noticesLive)
				w.kickRefresh() // releases may have been missed while not subscribed
			}
		},
	})
	if err := dc.Do(ctx, dc.B().Psubscribe().Pattern(w.noticePattern()).Build()).Error(); err != nil {
		return err
	}
	select {
	case err := <-lost:
		return err
	case <-ctx.Done():
		return nil
	}
}

// globQuote quotes the characters a pattern treats specially.
func globQuote(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
