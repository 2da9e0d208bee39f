// dlock web: the page's script. It keeps one server-sent event stream (/api/stream) open and
// renders what it pushes: "state" (the held locks and the server's status) and "history"
// (events the page has not had). Lease times count down here between two pushes.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const meta = (name) => document.querySelector('meta[name="' + name + '"]').content;
  const token = meta("dlock-token");
  const allowUnlock = meta("dlock-allow-unlock") === "yes";
  const maxEvents = 1000;

  let locks = [];          // the last state's locks
  let receivedAt = 0;      // performance.now() when they arrived
  let readAge = null;      // how long before receivedAt the server last listed the locks (ms)
  let events = [];         // history, oldest first
  let selected = null;     // name_b64 of the lock whose history is shown; null: all
  const rows = new Map();  // name_b64 -> {tr, cells, lock}
  const fullLease = new Map(); // name_b64+token -> the longest lease seen, for the bar

  // The filters start from the page's address (?name_prefix=, ?history_name=, ?kinds=) and
  // are kept there as they change, so that a link or a reload shows the same.
  const params = new URLSearchParams(location.search);
  const filter = $("filter");
  filter.value = params.get("name_prefix") ?? params.get("prefix") ?? "";
  const historyName = $("history-name");
  historyName.value = params.get("history_name") || "";
  // The kinds of history entries, in groups of one checkbox each.
  const kindGroups = {
    acquired: ["acquired"], released: ["released"], granted: ["granted"],
    lost: ["expired", "gone", "holder-not-running"], forced: ["force-unlocked"],
  };
  const kindBoxes = Array.from(document.querySelectorAll("#history-kinds input[type=checkbox]"));
  if (params.has("kinds")) {
    const on = new Set(params.get("kinds").split(","));
    for (const b of kindBoxes) b.checked = on.has(b.value);
  }
  function shownKinds() {
    const k = new Set();
    for (const b of kindBoxes) if (b.checked) for (const x of kindGroups[b.value]) k.add(x);
    return k;
  }
  function keepInURL() {
    const u = new URL(location.href);
    u.searchParams.delete("prefix");
    const set = (k, v) => { if (v) u.searchParams.set(k, v); else u.searchParams.delete(k); };
    set("name_prefix", filter.value);
    set("history_name", historyName.value);
    set("kinds", kindBoxes.every((b) => b.checked) ? "" : kindBoxes.filter((b) => b.checked).map((b) => b.value).join(",") || "none");
    history.replaceState(null, "", u);
  }
  filter.addEventListener("input", () => { keepInURL(); render(); renderHistory(); });
  historyName.addEventListener("input", () => { keepInURL(); renderHistory(); });
  for (const b of kindBoxes) b.addEventListener("change", () => { keepInURL(); renderHistory(); });
  $("history-all").addEventListener("click", () => { selected = null; renderHistory(); });

  // fmtDur writes a duration of ms milliseconds (fractions count) readably at every scale:
  // "850 µs", "4.2 ms", "12 ms", "1.4 s", "12 s", "3 min 5 s", "2 h 5 min", "3 d 4 h".
  function fmtDur(ms) {
    if (ms == null || Number.isNaN(ms)) return "–";
    if (ms < 0) ms = 0;
    const us = Math.round(ms * 1000);
    if (us < 1000) return us + " µs";
    if (us < 9950) return (us / 1000).toFixed(1) + " ms";
    if (Math.round(ms) < 1000) return Math.round(ms) + " ms";
    if (ms < 9950) return (ms / 1000).toFixed(1) + " s";
    const s = Math.round(ms / 1000);
    if (s < 60) return s + " s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + " min" + (s % 60 ? " " + (s % 60) + " s" : "");
    const h = Math.floor(m / 60);
    if (h < 48) return h + " h" + (m % 60 ? " " + (m % 60) + " min" : "");
    return Math.floor(h / 24) + " d" + (h % 24 ? " " + (h % 24) + " h" : "");
  }
  // The hold of a JSON object: its microseconds when given, else its milliseconds.
  const holdOf = (us, ms) => (us != null ? us / 1000 : ms);

  // displayName is a lock name as the page writes it: the exact bytes (name_b64) decoded as
  // UTF-8, with any byte that is not part of UTF-8 text written \xNN (JSON has carried it as
  // U+FFFD, which names no lock).
  function displayName(name, b64) {
    if (!b64 || name.indexOf("\uFFFD") < 0) return name;
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const dec = new TextDecoder("utf-8", { fatal: true });
    let out = "";
    for (let i = 0; i < bytes.length;) {
      const b = bytes[i];
      if (b < 0x80) { out += String.fromCharCode(b); i++; continue; }
      const n = b >= 0xf0 && b < 0xf8 ? 4 : b >= 0xe0 && b < 0xf0 ? 3 : b >= 0xc2 && b < 0xe0 ? 2 : 0;
      if (n && i + n <= bytes.length) {
        try { out += dec.decode(bytes.subarray(i, i + n)); i += n; continue; } catch (_) { /* not UTF-8 */ }
      }
      out += "\\x" + b.toString(16).padStart(2, "0");
      i++;
    }
    return out;
  }
  window.dlockPage = { fmtDur, displayName, events: () => events }; // for the browser test

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function visible(shown) {
    return shown.startsWith(filter.value);
  }

  // --- the table of held locks ---------------------------------------------------------

  function makeRow(l) {
    const tr = el("tr");
    tr.dataset.name = l.name;
    tr.dataset.nameB64 = l.name_b64;
    const c = {};
    const nameTd = el("td", "name");
    c.name = el("button", "link", l.shown);
    c.name.type = "button";
    c.name.title = "show this lock's history";
    c.name.addEventListener("click", () => { selected = tr.dataset.nameB64; renderHistory(); });
    c.kind = el("span", "pill kind");
    c.kind.hidden = true;
    c.leader = el("div", "leader");
    c.leader.hidden = true;
    c.extra = el("div", "extra muted");
    nameTd.append(c.name, c.kind, c.leader, c.extra);
    c.holder = el("td", "holder");
    c.token = el("td", "num token");
    c.lease = el("td", "lease");
    c.leaseText = el("span", "lease-text");
    c.leaseBar = el("span", "bar");
    c.leaseFill = el("span", "fill");
    c.leaseBar.append(c.leaseFill);
    c.lease.append(c.leaseText, c.leaseBar);
    c.holds = el("td", "num holds");
    c.waiters = el("td", "num waiters");
    c.typical = el("td", "num typical");
    c.age = el("td", "num age");
    tr.append(nameTd, c.holder, c.token, c.lease, c.holds, c.waiters, c.typical, c.age);
    if (allowUnlock) {
      const td = el("td", "actions");
      c.unlock = el("button", "danger small unlock", "Force unlock");
      c.unlock.type = "button";
      c.unlock.addEventListener("click", () => confirmUnlock(rows.get(tr.dataset.nameB64).lock));
      td.append(c.unlock);
      tr.append(td);
    }
    return { tr, c, lock: l };
  }

  function oneHolder(f, h, extra) {
    f.append(el("span", "host", h.host || "-"), el("span", "muted", " · pid "), el("span", "pid", String(h.pid)));
    if (h.label) f.append(el("span", "label", h.label));
    if (extra) f.append(el("span", "muted", " " + extra));
  }

  function holderNode(l) {
    const f = document.createDocumentFragment();
    const sh = l.shared; // read-write locks and semaphores: several holders
    if (sh && Array.isArray(sh.holders) && sh.holders.length > 0) {
      sh.holders.slice(0, 3).forEach((x, i) => {
        const d = el("div", "sharer");
        const what = x.write ? "writes" : l.kind === "semaphore" ? x.permits + " permit" + (x.permits === 1 ? "" : "s") : "reads";
        oneHolder(d, x.holder || {}, what);
        f.append(d);
      });
      if (sh.holders.length > 3) f.append(el("div", "muted", "+" + (sh.holders.length - 3) + " more"));
      return f;
    }
    const h = l.holder;
    if (!h) {
      const u = el("span", "muted unknown", "…");
      u.title = "granted to a queued client just now: its holder is being read";
      f.append(u);
      return f;
    }
    oneHolder(f, h);
    if (l.holder_alive === false) f.append(el("span", "pill bad", "not running"));
    return f;
  }

  // The fields of "dlock list --json" and of the page that have a column; any other field (a
  // later kind of lock may add some) is shown under the name.
  const known = new Set(["name", "held", "token", "token_time", "holds", "ttl_ms", "holder", "holder_alive", "waiters",
    "waiting_goroutines", "kind", "shared", "hold_stats", "age_ms", "typical_hold_ms", "typical_hold_us", "holds_seen",
    "name_b64", "shown", "leader"]);

  function extraText(l) {
    const parts = [];
    if (l.shared) {
      const sh = l.shared;
      if (l.kind === "semaphore" && sh.size) parts.push(sh.permits + "/" + sh.size + " permits taken");
      else if (sh.readers) parts.push(sh.readers + " reader" + (sh.readers === 1 ? "" : "s"));
      if (sh.writers_queued) parts.push(sh.writers_queued + " writer" + (sh.writers_queued === 1 ? "" : "s") + " queued");
    }
    for (const [k, v] of Object.entries(l)) {
      if (known.has(k) || v == null || v === "" || v === false) continue;
      let t = typeof v === "object" ? JSON.stringify(v) : String(v);
      if (t.length > 80) t = t.slice(0, 77) + "…";
      parts.push(k + ": " + t);
    }
    return parts.join(" · ");
  }

  function updateRow(r, l) {
    const prev = r.lock;
    r.lock = l;
    const c = r.c;
    if (!prev || prev === l || JSON.stringify([prev.holder, prev.shared]) !== JSON.stringify([l.holder, l.shared]) || prev.holder_alive !== l.holder_alive) {
      c.holder.replaceChildren(holderNode(l));
    }
    // An election's leader holds the lock: its kind says so, and its value, term and the
    // candidates queued behind it show under the name.
    const kind = l.leader ? "election" : l.kind;
    c.kind.hidden = !kind;
    c.kind.textContent = kind || "";
    c.leader.hidden = !l.leader;
    if (l.leader) {
      const w = l.waiters;
      c.leader.replaceChildren(el("span", "muted", "leader "), el("span", "value", displayName(l.leader.value, l.leader.value_b64)),
        el("span", "muted", " · term "), el("span", "term", String(l.leader.term)),
        el("span", "muted", w < 0 ? "" : " · " + w + " candidate" + (w === 1 ? "" : "s") + " waiting"));
      c.leader.title = "leads since " + (l.leader.since || "?") + " (server clock)";
    }
    c.extra.textContent = extraText(l);
    c.extra.hidden = c.extra.textContent === "";
    c.token.textContent = String(l.token);
    c.token.title = l.token_time ? "acquired " + l.token_time + " (server clock)" : "";
    c.holds.textContent = String(l.holds);
    // Waiting clients, and the goroutines waiting in them where the server knows.
    const g = l.waiting_goroutines;
    c.waiters.replaceChildren(el("span", "", l.waiters < 0 ? "?" : String(l.waiters)));
    if (typeof g === "number" && g >= 0 && (g > 0 || l.waiters > 0)) {
      c.waiters.append(el("span", "goroutines muted", g + " goroutine" + (g === 1 ? "" : "s")));
    }
    c.waiters.title = "clients queued for the lock" + (typeof g === "number" ? ", and the goroutines waiting in them" : "");
    c.waiters.classList.toggle("contended", l.waiters > 0);
    // Typical hold: the server's record where the lock keeps one, else the holds this page saw end.
    const hs = l.hold_stats;
    if (hs && hs.count > 0) {
      c.typical.textContent = fmtDur(hs.typical_ms);
      c.typical.title = "the server's record of " + hs.count + " hold(s): typical " + fmtDur(hs.typical_ms) + ", high " + fmtDur(hs.high_ms) + ", last " + fmtDur(hs.last_ms);
    } else {
      c.typical.textContent = fmtDur(holdOf(l.typical_hold_us, l.typical_hold_ms));
      c.typical.title = l.holds_seen ? "median of the " + l.holds_seen + " hold(s) this page saw end" : "no hold of this lock seen ending yet";
    }
    const k = l.name_b64 + "\u0000" + l.token;
    fullLease.set(k, Math.max(fullLease.get(k) || 0, l.ttl_ms));
  }

  function render() {
    const shown = locks.filter((l) => visible(l.shown));
    const names = new Set(shown.map((l) => l.name_b64));
    for (const [name, r] of rows) {
      if (!names.has(name)) { r.tr.remove(); rows.delete(name); }
    }
    const tbody = $("rows");
    let before = tbody.firstChild;
    for (const l of shown) { // sorted by name by the server
      let r = rows.get(l.name_b64);
      if (!r) { r = makeRow(l); rows.set(l.name_b64, r); }
      updateRow(r, l);
      if (r.tr !== before) tbody.insertBefore(r.tr, before);
      before = r.tr.nextSibling;
    }
    const empty = $("empty");
    empty.hidden = shown.length > 0;
    empty.textContent = locks.length === 0 ? "No lock is held." : "No held lock matches the filter.";
    $("count").textContent = shown.length === locks.length ? locks.length + " held" : shown.length + " of " + locks.length + " held";
    for (const k of fullLease.keys()) { // forget the leases of locks no longer shown
      if (!names.has(k.slice(0, k.indexOf("\u0000")))) fullLease.delete(k);
    }
    tick();
  }

  // tick counts the leases down and the hold ages up, between two pushes.
  function tick() {
    const since = performance.now() - receivedAt;
    for (const r of rows.values()) {
      const l = r.lock;
      const left = Math.max(l.ttl_ms - since, 0);
      r.c.lease.dataset.leftMs = String(Math.round(left));
      r.c.leaseText.textContent = left > 0 ? fmtDur(left) : "running out";
      const full = fullLease.get(l.name_b64 + "\u0000" + l.token) || l.ttl_ms || 1;
      r.c.leaseFill.style.width = Math.min(100, (100 * left) / full).toFixed(1) + "%";
      r.c.lease.classList.toggle("low", left < full / 3);
      r.c.age.textContent = l.age_ms == null ? "–" : fmtDur(l.age_ms + since);
    }
    if (readAge != null) {
      const ago = (readAge + since) / 1000;
      $("refreshed").textContent = "listed " + (ago < 1 ? "just now" : fmtDur(Math.floor(ago) * 1000) + " ago");
    }
  }
  setInterval(tick, 100);

  // --- history -----------------------------------------------------------------------------

  const kindText = {
    "acquired": "acquired", "released": "released", "granted": "granted", "expired": "lease ran out",
    "gone": "gone", "force-unlocked": "force-unlocked", "holder-not-running": "holder not running",
    "handoffs": "hot lock",
  };
  const clock = (iso) => {
    const t = new Date(iso);
    return t.toLocaleTimeString([], { hour12: false }) + "." + String(t.getMilliseconds()).padStart(3, "0");
  };
  const count = (n) => n.toLocaleString("en-US");

  // foldText is what a fold of a hot lock's handoffs says, now: how many in the last 10 s
  // while they go on (its per-second counts, aged by the time since the fold arrived), else
  // how many in all, from when to when.
  function foldText(e) {
    const f = e.fold;
    const age = performance.now() - e.receivedAt;
    let recent = 0;
    (f.recent || []).forEach((n, i) => { if (i * 1000 + age < 10000) recent += n; });
    if (recent > 0) {
      return count(recent) + " handoff" + (recent === 1 ? "" : "s") + " in the last 10 s · " + count(f.count) + " since " + clock(f.since);
    }
    return count(f.count) + " handoffs from " + clock(f.since) + " to " + clock(e.time);
  }
  function foldKinds(f) {
    return Object.entries(f.kinds || {}).map(([k, n]) => count(n) + " " + (kindText[k] || k)).join(", ");
  }

  // An entry is shown when its kind is ticked (a fold: one of the kinds it counts), its name
  // contains the history's name filter and starts with the table's, or it is the selected lock's.
  function historyShown(e, kinds, needle) {
    if (selected != null) {
      if (e.name_b64 !== selected) return false;
    } else if (!visible(e.shown)) return false;
    if (needle && !e.shown.toLowerCase().includes(needle)) return false;
    if (e.fold) return Object.keys(e.fold.kinds || {}).some((k) => kinds.has(k));
    return kinds.has(e.kind);
  }

  let historyTimer = null;
  // scheduleHistory renders the history soon: a hot lock sends many batches a second.
  function scheduleHistory() {
    if (historyTimer == null) historyTimer = setTimeout(() => { historyTimer = null; renderHistory(); }, 100);
  }

  function renderHistory() {
    const list = $("history");
    const kinds = shownKinds();
    const needle = historyName.value.toLowerCase();
    const items = [];
    let total = 0;
    for (let i = events.length - 1; i >= 0; i--) {
      const e = events[i];
      if (!historyShown(e, kinds, needle)) continue;
      total++;
      if (items.length >= 300) continue;
      const li = el("li", "ev " + e.kind);
      li.dataset.kind = e.kind;
      li.dataset.name = e.name;
      li.dataset.nameB64 = e.name_b64;
      li.append(el("time", "muted", clock(e.time)));
      li.append(el("span", "kind", kindText[e.kind] || e.kind));
      const n = el("button", "link name", e.shown);
      n.type = "button";
      n.addEventListener("click", () => { selected = e.name_b64; renderHistory(); });
      li.append(n);
      li.append(el("span", "token muted", e.token ? String(e.token) : ""));
      li.append(el("span", "holder", e.holder || ""));
      if (e.fold) {
        li.dataset.count = String(e.fold.count);
        li.append(el("span", "held", ""));
        const d = el("span", "detail fold-text", foldText(e));
        d.title = foldKinds(e.fold) + " (folded into one entry: the lock changes hands too often to list each)";
        li.append(d);
        li.fold = e;
      } else {
        const held = holdOf(e.hold_us, e.hold_ms);
        li.append(el("span", "held", held != null ? "held " + fmtDur(held) : ""));
        li.append(el("span", "detail muted", e.detail || ""));
      }
      items.push(li);
    }
    list.replaceChildren(...items);
    const empty = $("history-empty");
    empty.hidden = items.length > 0;
    empty.textContent = events.length === 0 ? "Nothing happened yet." : "No entry matches the filters.";
    $("history-count").textContent = total === events.length ? "" : total + " of " + events.length + " entries";
    const sel = selected == null ? null : events.find((e) => e.name_b64 === selected) || locks.find((l) => l.name_b64 === selected);
    $("history-title").textContent = selected == null ? "History while this page is open" : "History of " + (sel ? sel.shown : "the lock");
    $("history-all").hidden = selected == null;
  }
  // A fold's "in the last 10 s" counts down while nothing new comes.
  setInterval(() => {
    for (const li of $("history").children) {
      if (li.fold) li.querySelector(".fold-text").textContent = foldText(li.fold);
    }
  }, 1000);

  // --- force unlock ----------------------------------------------------------------------

  const dialog = $("confirm");
  let pending = null;

  function confirmUnlock(l) {
    pending = l;
    $("confirm-name").textContent = l.shown;
    $("confirm-holder").textContent = l.holder ? (l.holder.host || "-") + " pid " + l.holder.pid + (l.holder.label ? " (" + l.holder.label + ")" : "") : "an unknown holder";
    $("confirm-token").textContent = String(l.token);
    $("confirm-error").hidden = true;
    $("confirm-ok").disabled = false;
    dialog.showModal();
  }

  $("confirm-ok").addEventListener("click", async (ev) => {
    ev.preventDefault();
    if (!pending) return;
    const ok = $("confirm-ok");
    ok.disabled = true;
    try {
      const resp = await fetch("/api/unlock", {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-Dlock-Token": token },
        body: JSON.stringify({ name_b64: pending.name_b64, token: pending.token }),
        credentials: "same-origin",
      });
      const body = await resp.json().catch(() => ({}));
      if (!resp.ok) throw new Error(body.error || resp.status + " " + resp.statusText);
      pending = null;
      dialog.close("done");
    } catch (e) {
      const p = $("confirm-error");
      p.textContent = e.message;
      p.hidden = false;
      ok.disabled = false;
    }
  });
  // The close event comes a moment after close(): by then the dialog may be open again for
  // another click (a quick Cancel, then Force unlock again), whose lock must stay pending.
  dialog.addEventListener("close", () => { if (!dialog.open) pending = null; });

  // --- the stream --------------------------------------------------------------------------

  function setPill(id, text, cls) {
    const p = $(id);
    p.textContent = text;
    p.className = "pill " + (cls || "");
  }

  const es = new EventSource("/api/stream");
  es.addEventListener("open", () => {
    setPill("conn", "live", "ok");
    events = []; // the server sends its whole history again
  });
  es.addEventListener("error", () => setPill("conn", "reconnecting…", "bad"));
  es.addEventListener("state", (m) => {
    const s = JSON.parse(m.data);
    for (const l of s.locks) l.shown = displayName(l.name, l.name_b64);
    locks = s.locks;
    receivedAt = performance.now();
    readAge = s.read_at ? s.read_age_ms : null;
    const err = $("error");
    err.hidden = !s.error;
    err.textContent = s.error ? "The last listing failed: " + s.error + " (showing the one before)" : "";
    if (s.notices === "live") setPill("notices", "release notices: live", "ok");
    else setPill("notices", "release notices: " + s.notices.split(":")[0], "warn");
    $("notices").title = s.notices === "live" ? "releases show at once" : s.notices + " (listed every " + fmtDur(s.refresh_ms) + ")";
    render();
  });
  es.addEventListener("history", (m) => {
    const batch = JSON.parse(m.data);
    const now = performance.now();
    for (const e of batch) {
      const last = events.length ? events[events.length - 1].seq : 0;
      if (e.seq <= last) continue;
      e.shown = displayName(e.name, e.name_b64);
      e.receivedAt = now;
      if (e.fold) {
        // The fold's latest copy replaces the one before and the entries it took in.
        const f = e.fold;
        events = events.filter((x) => !(x.fold ? x.fold.id === f.id
          : x.name_b64 === e.name_b64 && x.seq >= f.first_seq && (x.kind === "acquired" || x.kind === "released" || x.kind === "granted")));
      }
      events.push(e);
    }
    if (events.length > maxEvents) events = events.slice(events.length - maxEvents);
    scheduleHistory();
  });
})();
