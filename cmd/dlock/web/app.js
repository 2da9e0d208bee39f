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
  let selected = null;     // lock name whose history is shown; null: all
  const rows = new Map();  // name -> {tr, cells, lock}
  const fullLease = new Map(); // name+token -> the longest lease seen, for the bar

  const filter = $("filter");
  filter.value = new URLSearchParams(location.search).get("prefix") || "";
  filter.addEventListener("input", () => {
    const u = new URL(location.href);
    if (filter.value) u.searchParams.set("prefix", filter.value); else u.searchParams.delete("prefix");
    history.replaceState(null, "", u);
    render();
    renderHistory();
  });
  $("history-all").addEventListener("click", () => { selected = null; renderHistory(); });

  function fmtDur(ms) {
    if (ms == null) return "–";
    if (ms < 0) ms = 0;
    if (ms < 10000) return (ms / 1000).toFixed(1) + "s";
    const s = Math.floor(ms / 1000);
    if (s < 60) return s + "s";
    const m = Math.floor(s / 60);
    if (m < 60) return m + "m " + String(s % 60).padStart(2, "0") + "s";
    const h = Math.floor(m / 60);
    if (h < 48) return h + "h " + String(m % 60).padStart(2, "0") + "m";
    return Math.floor(h / 24) + "d " + (h % 24) + "h";
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function visible(name) {
    return name.startsWith(filter.value);
  }

  // --- the table of held locks ---------------------------------------------------------

  function makeRow(l) {
    const tr = el("tr");
    tr.dataset.name = l.name;
    const c = {};
    const nameTd = el("td", "name");
    c.name = el("button", "link", l.name);
    c.name.type = "button";
    c.name.title = "show this lock's history";
    c.name.addEventListener("click", () => { selected = tr.dataset.name; renderHistory(); });
    c.kind = el("span", "pill kind");
    c.kind.hidden = true;
    c.extra = el("div", "extra muted");
    nameTd.append(c.name, c.kind, c.extra);
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
      c.unlock.addEventListener("click", () => confirmUnlock(rows.get(tr.dataset.name).lock));
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
    if (!h) { f.append(el("span", "muted", "…")); return f; }
    oneHolder(f, h);
    if (l.holder_alive === false) f.append(el("span", "pill bad", "not running"));
    return f;
  }

  // The fields of "dlock list --json" and of the page that have a column; any other field (a
  // later kind of lock may add some) is shown under the name.
  const known = new Set(["name", "held", "token", "token_time", "holds", "ttl_ms", "holder", "holder_alive", "waiters",
    "waiting_goroutines", "kind", "shared", "hold_stats", "age_ms", "typical_hold_ms", "holds_seen"]);

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
    c.kind.hidden = !l.kind;
    c.kind.textContent = l.kind || "";
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
      c.typical.textContent = l.typical_hold_ms == null ? "–" : fmtDur(l.typical_hold_ms);
      c.typical.title = l.holds_seen ? "median of the " + l.holds_seen + " hold(s) this page saw end" : "no hold of this lock seen ending yet";
    }
    const k = l.name + "\u0000" + l.token;
    fullLease.set(k, Math.max(fullLease.get(k) || 0, l.ttl_ms));
  }

  function render() {
    const shown = locks.filter((l) => visible(l.name));
    const names = new Set(shown.map((l) => l.name));
    for (const [name, r] of rows) {
      if (!names.has(name)) { r.tr.remove(); rows.delete(name); }
    }
    const tbody = $("rows");
    let before = tbody.firstChild;
    for (const l of shown) { // sorted by name by the server
      let r = rows.get(l.name);
      if (!r) { r = makeRow(l); rows.set(l.name, r); }
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
      const full = fullLease.get(l.name + "\u0000" + l.token) || l.ttl_ms || 1;
      r.c.leaseFill.style.width = Math.min(100, (100 * left) / full).toFixed(1) + "%";
      r.c.lease.classList.toggle("low", left < full / 3);
      r.c.age.textContent = l.age_ms == null ? "–" : fmtDur(l.age_ms + since);
    }
    if (readAge != null) {
      const ago = (readAge + since) / 1000;
      $("refreshed").textContent = "listed " + (ago < 1 ? "just now" : Math.floor(ago) + "s ago");
    }
  }
  setInterval(tick, 100);

  // --- history -----------------------------------------------------------------------------

  const kindText = {
    "acquired": "acquired", "released": "released", "granted": "granted", "expired": "lease ran out",
    "gone": "gone", "force-unlocked": "force-unlocked", "holder-not-running": "holder not running",
  };

  function renderHistory() {
    const list = $("history");
    const shown = events.filter((e) => (selected == null ? visible(e.name) : e.name === selected));
    const items = [];
    for (let i = shown.length - 1; i >= 0 && items.length < 300; i--) {
      const e = shown[i];
      const li = el("li", "ev " + e.kind);
      li.dataset.kind = e.kind;
      li.dataset.name = e.name;
      const t = new Date(e.time);
      li.append(el("time", "muted", t.toLocaleTimeString([], { hour12: false }) + "." + String(t.getMilliseconds()).padStart(3, "0")));
      li.append(el("span", "kind", kindText[e.kind] || e.kind));
      const n = el("button", "link name", e.name);
      n.type = "button";
      n.addEventListener("click", () => { selected = e.name; renderHistory(); });
      li.append(n);
      li.append(el("span", "token muted", e.token ? String(e.token) : ""));
      li.append(el("span", "holder", e.holder || ""));
      li.append(el("span", "held", e.hold_ms != null ? "held " + fmtDur(e.hold_ms) : ""));
      li.append(el("span", "detail muted", e.detail || ""));
      items.push(li);
    }
    list.replaceChildren(...items);
    $("history-empty").hidden = items.length > 0;
    $("history-title").textContent = selected == null ? "History while this page is open" : "History of " + selected;
    $("history-all").hidden = selected == null;
  }

  // --- force unlock ----------------------------------------------------------------------

  const dialog = $("confirm");
  let pending = null;

  function confirmUnlock(l) {
    pending = l;
    $("confirm-name").textContent = l.name;
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
        body: JSON.stringify({ name: pending.name, token: pending.token }),
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
  dialog.addEventListener("close", () => { pending = null; });

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
    const last = events.length ? events[events.length - 1].seq : 0;
    for (const e of batch) if (e.seq > last) events.push(e);
    if (events.length > maxEvents) events = events.slice(events.length - maxEvents);
    renderHistory();
  });
})();
