// Rankwise keeps JavaScript to a minimum: htmx does the work. The one exception is the launch
// log viewer. The page holds a bounded window of lines (CAP at most, whatever the log's
// length); older or newer ones are read from the stored log by sequence number as you scroll.
// Live lines come from a Server-Sent Events stream (EventSource reconnects by itself and sends
// Last-Event-ID, so the server resumes after the last line received). Scrolling up pauses the
// window; "Follow live" returns to the end and says how many lines arrived meanwhile. Search,
// filters and "go to line" are answered by the server over the whole stored log.
// A row is [seq, text, level, rank, node]: node names the node that printed the line in a
// multi-node launch ("" on one node; rows from an older server have no fifth field).
(function () {
  const log = document.getElementById("launch-log");
  if (!log) return;
  const CAP = 3000; // lines the page holds at most
  const PAGE = 500; // lines read per scroll step
  // The scheduler's decode-batch line, as the server recognises it (domain.log_lines).
  const DECODE = new RegExp(log.dataset.decodePattern || "(?!)");
  const $ = (id) => document.getElementById(id);
  const status = $("log-status");
  const followButton = $("log-follow");
  const matchesLabel = $("log-matches");
  const nodeSelect = $("log-node"); // only on a launch over several nodes
  const nodeWanted = () => (nodeSelect ? nodeSelect.value : "");
  // The diagnosis names its evidence by line number (and may arrive after the page did).
  let evidence = new Set();
  function readEvidence() {
    evidence = new Set(
      [...document.querySelectorAll("[data-evidence-line]")].map((e) => Number(e.dataset.evidenceLine)),
    );
    for (const seq of evidence) {
      const span = document.getElementById(`line-${seq}`);
      if (span) span.classList.add("evidence");
    }
  }
  readEvidence();
  document.body.addEventListener("htmx:afterSettle", readEvidence);

  let last = Number(log.dataset.lastSeq || 0); // the last line received from the live stream
  let count = 0;
  let moreBefore = log.dataset.moreBefore === "true";
  let atTail = true; // the window ends with the last line received (matching the filters)
  let following = true;
  let arrived = 0; // lines received while paused (matching the filters)
  let loading = false;
  let live = true; // until the stream says the log is complete
  let queue = []; // live rows waiting for the next frame
  let query = "";
  let matches = [];
  let current = -1;
  let failures = 0;
  let polling = null;

  function filters() {
    const params = new URLSearchParams();
    const level = $("log-level").value;
    if (level === "evidence") params.set("evidence", "1");
    else if (level) params.set("level", level);
    if ($("log-rank").value) params.set("rank", $("log-rank").value);
    if (nodeWanted()) params.set("node", nodeWanted());
    return params;
  }
  function wanted(row) {
    const [seq, , level, rank, node] = row;
    const want = $("log-level").value;
    if (want === "evidence" && !evidence.has(seq)) return false;
    if (want === "warning" && level < 1) return false;
    if (want === "error" && level < 2) return false;
    const r = $("log-rank").value;
    const n = nodeWanted();
    return (!r || r === rank) && (!n || n === (node || ""));
  }
  function collapsing() {
    return $("log-collapse").checked;
  }

  // --- rendering -------------------------------------------------------------------------------
  // A line's span: its node's tag (a multi-node launch's), then its text, marked where it
  // matches the search.
  function fill(span, text) {
    span.textContent = "";
    if (span.dataset.node) {
      const tag = document.createElement("span");
      tag.className = "node-tag";
      tag.textContent = span.dataset.node;
      span.append(tag);
    }
    if (!query) {
      span.append(text + "\n");
      return;
    }
    const lower = text.toLowerCase();
    const needle = query.toLowerCase();
    if (lower.length !== text.length) {
      // Lower-casing changed the length (some Unicode letters): marks would land astray.
      span.append(text + "\n");
      return;
    }
    let at = 0;
    for (let i = lower.indexOf(needle); i >= 0; i = lower.indexOf(needle, at)) {
      span.append(text.slice(at, i));
      const mark = document.createElement("mark");
      mark.textContent = text.slice(i, i + needle.length);
      span.append(mark);
      at = i + needle.length;
    }
    span.append(text.slice(at) + "\n");
  }
  // A line's text as printed, without its node's tag.
  function textOf(span) {
    let text = "";
    for (const child of span.childNodes) {
      if (child.nodeType === 1 && child.classList.contains("node-tag")) continue;
      text += child.textContent;
    }
    return text.replace(/\n$/, "");
  }
  function line(row) {
    const [seq, text, level, , node] = row;
    const span = document.createElement("span");
    span.dataset.seq = seq;
    span.id = `line-${seq}`;
    if (level) span.dataset.level = level;
    if (node) span.dataset.node = node;
    if (evidence.has(seq)) span.classList.add("evidence");
    span.dataset.decode = DECODE.test(text) ? "1" : "";
    fill(span, text);
    return span;
  }
  function group() {
    const details = document.createElement("details");
    details.className = "decode-group";
    details.append(document.createElement("summary"));
    return details;
  }
  // A group is its summary followed by its lines, so counting needs no search: the window's
  // one group can hold thousands of lines and is labelled at every live append.
  // The label says which lines the group holds: it counts the window's lines, not the log's.
  function label(details) {
    const n = details.childElementCount - 1;
    const first = Number(details.firstElementChild.nextElementSibling.dataset.seq);
    const latest = details.lastElementChild;
    const end = Number(latest.dataset.seq);
    const where = n === 1 ? `line ${end.toLocaleString()}` : `lines ${first.toLocaleString()}–${end.toLocaleString()}`;
    details.firstChild.textContent =
      `${n.toLocaleString()} decode-batch line${n === 1 ? "" : "s"} (${where}), latest: ` +
      textOf(latest).trim();
  }
  const isGroup = (node) => Boolean(node && node.classList && node.classList.contains("decode-group"));
  const isDecode = (node) => Boolean(node && (isGroup(node) || node.dataset.decode));
  // Rows (ascending) as nodes: a run of two or more decode-batch lines is one counted group.
  function nodes(rows) {
    const out = [];
    let run = [];
    const close = () => {
      if (run.length >= 2 && collapsing()) {
        const g = group();
        g.append(...run);
        label(g);
        out.push(g);
      } else out.push(...run);
      run = [];
    };
    for (const row of rows) {
      const span = line(row);
      if (span.dataset.decode) run.push(span);
      else {
        close();
        out.push(span);
      }
    }
    close();
    return out;
  }
  // A run of decode-batch lines that goes on past the window's edge joins the one shown there.
  function join(edge, made, atEnd) {
    if (!collapsing() || !isDecode(edge) || !isDecode(made)) return false;
    let g = edge;
    if (!isGroup(edge)) {
      g = group();
      edge.replaceWith(g);
      g.append(edge);
    }
    const spans = isGroup(made) ? [...made.querySelectorAll("span[data-seq]")] : [made];
    if (atEnd) g.append(...spans);
    else g.firstChild.after(...spans);
    label(g);
    return true;
  }
  // A window with no lines says why, instead of an empty strip.
  let emptyNote = null; // kept, not searched for: empty() runs at every live append
  function empty() {
    if (count) {
      if (emptyNote) emptyNote.remove();
      emptyNote = null;
      return;
    }
    const filtered = $("log-level").value || $("log-rank").value || nodeWanted();
    const words = filtered ? "No lines match these filters." : live ? "No lines yet." : "The server printed no lines.";
    if (!emptyNote) {
      emptyNote = document.createElement("span");
      emptyNote.className = "log-empty";
    }
    emptyNote.textContent = words;
    if (!emptyNote.isConnected) log.append(emptyNote);
  }
  function append(rows) {
    if (!rows.length) return;
    const made = nodes(rows);
    if (join(log.lastElementChild, made[0], true)) made.shift();
    log.append(...made);
    count += rows.length;
    empty();
  }
  function prepend(rows) {
    if (!rows.length) return;
    const made = nodes(rows);
    if (join(log.firstElementChild, made[made.length - 1], false)) made.pop();
    log.prepend(...made);
    count += rows.length;
    empty();
  }
  // Drop lines from one end until the window holds CAP.
  function trim(fromTop) {
    while (count > CAP) {
      const edge = fromTop ? log.firstElementChild : log.lastElementChild;
      if (!edge) break;
      if (isGroup(edge)) {
        // All the lines to drop from a group at once: one by one, each drop re-read the group.
        const size = edge.childElementCount - 1;
        const drop = Math.min(count - CAP, size);
        if (drop === size) edge.remove();
        else {
          for (let i = 0; i < drop; i++) {
            (fromTop ? edge.firstElementChild.nextElementSibling : edge.lastElementChild).remove();
          }
          label(edge);
        }
        count -= drop;
      } else {
        edge.remove();
        count -= 1;
      }
    }
  }
  function seqs() {
    const spans = log.querySelectorAll("span[data-seq]");
    if (!spans.length) return [0, 0];
    return [Number(spans[0].dataset.seq), Number(spans[spans.length - 1].dataset.seq)];
  }
  function replace(rows, more) {
    log.textContent = "";
    count = 0;
    append(rows);
    empty();
    moreBefore = more.more_before;
    atTail = !more.more_after;
  }
  // The button and the status are written only when what they say changes: say() runs for
  // every event. The status is the stream's: connecting, following, paused, reconnecting…
  let said = null;
  let stated = null;
  let stream = "connecting"; // connecting | open | reconnecting | polling | ended
  function say() {
    let words = "";
    if (!live) words = atTail ? "" : "Go to the end"; // an ended log's end in the window: scroll
    else if (following && atTail) words = "";
    else if (arrived) words = `Follow live (${arrived.toLocaleString()} new line${arrived === 1 ? "" : "s"})`;
    else words = "Follow live";
    if (words !== said) {
      said = words;
      followButton.hidden = !words;
      if (words) followButton.textContent = words;
    }
    let state = "";
    if (stream === "ended") state = "Log complete.";
    else if (stream === "reconnecting") state = "Reconnecting…";
    else if (stream !== "connecting" && !(following && atTail)) state = "Paused: new lines are counted on the button, not shown.";
    else if (stream === "polling") state = "Following by polling.";
    else if (stream === "open") state = "Following live.";
    if (state !== stated) {
      stated = state;
      status.textContent = state;
    }
  }
  // A note about what was asked (a read that failed, a line past the end): it stays until the
  // stream's state changes.
  function note(words) {
    status.textContent = words;
  }

  // --- reading the stored log ------------------------------------------------------------------
  async function read(params) {
    for (const [k, v] of filters()) params.set(k, v);
    const response = await fetch(`${log.dataset.lines}?${params}`);
    return answer(response);
  }
  // A JSON answer, or an error that says what went wrong (a login page or a 404 is HTML).
  async function answer(response) {
    const json = (response.headers.get("Content-Type") || "").includes("application/json");
    if (response.redirected || !json) {
      throw new Error(response.status === 404 ? "no such launch" : "log in again (reload the page)");
    }
    const doc = await response.json();
    if (!response.ok) throw new Error(doc.error || response.statusText);
    return doc;
  }
  // One read at a time for scrolling; what the operator asked for (a jump, the end, a filter)
  // goes ahead at once, and a scroll read it overtook is dropped when it answers.
  let generation = 0;
  async function guarded(work, asked = false) {
    if (loading && !asked) return;
    const mine = ++generation;
    loading = true;
    try {
      await work(() => mine === generation);
    } catch (error) {
      note(`Could not read the log: ${error.message}`);
    } finally {
      if (mine === generation) loading = false;
    }
  }
  function toTail() {
    return guarded(async (current) => {
      const doc = await read(new URLSearchParams({ limit: String(PAGE * 2) }));
      if (!current()) return;
      replace(doc.lines, doc);
      atTail = true;
      following = true;
      arrived = 0;
      queue = [];
      log.scrollTop = log.scrollHeight;
      say();
    }, true);
  }
  function jump(seq) {
    return guarded(async (current) => {
      const doc = await read(new URLSearchParams({ around: String(seq), limit: String(PAGE * 2) }));
      if (!current()) return;
      replace(doc.lines, doc);
      following = false;
      arrived = 0;
      if (seq > doc.last_seq) note(`The log has ${doc.last_seq.toLocaleString()} lines: showing its end.`);
      const target = $(`line-${seq}`) ||
        [...log.querySelectorAll("span[data-seq]")].find((s) => Number(s.dataset.seq) >= seq);
      for (const old of log.querySelectorAll(".current")) old.classList.remove("current");
      if (target) {
        target.classList.add("current");
        const holder = target.closest("details");
        if (holder) holder.open = true;
        target.scrollIntoView({ block: "center" });
      }
      say();
    }, true);
  }
  function earlier() {
    return guarded(async (current) => {
      const [first] = seqs();
      const doc = await read(new URLSearchParams({ before: String(first), limit: String(PAGE) }));
      if (!current()) return;
      const height = log.scrollHeight;
      prepend(doc.lines);
      moreBefore = doc.more_before;
      log.scrollTop += log.scrollHeight - height; // keep the lines read in place
      if (count > CAP) {
        trim(false);
        atTail = false;
        following = false;
      }
      say();
    });
  }
  function later() {
    return guarded(async (current) => {
      const [, end] = seqs();
      const doc = await read(new URLSearchParams({ after: String(end), limit: String(PAGE) }));
      if (!current()) return;
      append(doc.lines);
      if (count > CAP) {
        const height = log.scrollHeight;
        trim(true);
        log.scrollTop -= height - log.scrollHeight;
        moreBefore = true;
      }
      atTail = !doc.more_after;
      if (atTail) {
        following = true;
        arrived = 0;
      }
      say();
    });
  }
  let ticking = false;
  const atBottom = () => log.scrollHeight - log.scrollTop - log.clientHeight < 40;
  log.addEventListener("scroll", () => {
    // Decided at once, before a frame's live lines could scroll the window back down.
    following = atBottom() && atTail;
    if (ticking) return;
    ticking = true;
    requestAnimationFrame(() => {
      ticking = false;
      if (atBottom() && !atTail) later();
      if (log.scrollTop < 200 && moreBefore) earlier();
      say();
    });
  });
  // A window that does not fill the box (one collapsed group, a few lines) never scrolls:
  // wheel or keys upwards at its top read earlier lines and pause, as scrolling up does.
  function pullEarlier() {
    if (log.scrollTop > 0 || !moreBefore) return;
    following = false;
    earlier();
    say();
  }
  log.addEventListener("wheel", (event) => { if (event.deltaY < 0) pullEarlier(); }, { passive: true });
  log.addEventListener("keydown", (event) => {
    if (["PageUp", "ArrowUp", "Home"].includes(event.key)) pullEarlier();
  });
  followButton.addEventListener("click", toTail);
  // A filter changes what a search finds: an active search is asked again with it (and, when
  // it finds nothing now, the window shows what the filter keeps).
  let refiltered = false;
  for (const select of [$("log-level"), $("log-rank"), nodeSelect, $("log-collapse")]) {
    if (!select) continue;
    select.addEventListener("change", () => {
      refiltered = Boolean(query);
      if (refiltered) $("log-search").requestSubmit();
      else toTail();
    });
  }
  $("log-goto").addEventListener("submit", (event) => {
    event.preventDefault();
    const seq = Number(new FormData(event.target).get("line"));
    if (seq >= 1) {
      current = -1;
      showMatches();
      jump(seq);
    }
  });
  // An evidence link (#line-N) goes to its line, read from the stored log when not in view.
  function lineOf(hash) {
    const found = /^#line-(\d+)$/.exec(hash);
    return found ? Number(found[1]) : 0;
  }
  document.addEventListener("click", (event) => {
    const link = event.target.closest && event.target.closest('a[href^="#line-"]');
    if (!link || !lineOf(link.getAttribute("href"))) return;
    event.preventDefault();
    history.replaceState(null, "", link.getAttribute("href"));
    log.scrollIntoView({ block: "nearest" });
    jump(lineOf(link.getAttribute("href")));
  });
  window.addEventListener("hashchange", () => {
    if (lineOf(location.hash)) jump(lineOf(location.hash));
  });

  // --- search ----------------------------------------------------------------------------------
  $("log-search").addEventListener("submit", async (event) => {
    event.preventDefault();
    query = String(new FormData(event.target).get("q") || "").trim();
    matches = [];
    current = -1;
    matchTotal = "";
    // A read still under way (a step to the previous match) must not mark its line once this
    // search has begun: its answer arrives to a generation that is no longer current.
    generation += 1;
    loading = false;
    for (const old of log.querySelectorAll(".current")) old.classList.remove("current");
    showMatches();
    if (!query) return toTail();
    const params = filters();
    params.set("q", query);
    let doc;
    try {
      doc = await answer(await fetch(`${log.dataset.search}?${params}`));
    } catch (error) {
      matchesLabel.textContent = `Search failed: ${error.message}`;
      return;
    }
    matches = doc.matches.map((row) => row[0]);
    moreMatches = doc.more;
    matchTotal = doc.capped ? `${doc.count.toLocaleString()}+` : doc.count.toLocaleString();
    matchCount = doc.count;
    showMatches();
    if (matches.length) step(1);
    else if (refiltered) toTail();
    else for (const span of log.querySelectorAll("span[data-seq]")) fill(span, textOf(span));
    refiltered = false;
  });
  // Matches come 200 at a time: stepping past the last one fetches the next ones.
  let moreMatches = false;
  let matchTotal = "";
  let matchCount = 0;
  function showMatches() {
    if (!matchTotal) matchesLabel.textContent = "";
    else if (current < 0) matchesLabel.textContent = `${matchTotal} match${matchCount === 1 ? "" : "es"}`;
    else matchesLabel.textContent = `Match ${(current + 1).toLocaleString()} of ${matchTotal}: line ${matches[current].toLocaleString()}`;
  }
  async function fetchMoreMatches() {
    const params = filters();
    params.set("q", query);
    params.set("after", String(matches[matches.length - 1]));
    try {
      const doc = await answer(await fetch(`${log.dataset.search}?${params}`));
      matches = matches.concat(doc.matches.map((row) => row[0]));
      moreMatches = doc.more;
    } catch (error) {
      note(`Search failed: ${error.message}`);
      moreMatches = false;
    }
  }
  async function step(by) {
    if (!matches.length) return;
    if (by > 0 && current === matches.length - 1 && moreMatches) await fetchMoreMatches();
    // Back from the first match wraps to the last only when every match has been read.
    if (by < 0 && current <= 0 && moreMatches) current = 0;
    else current = (current + by + matches.length) % matches.length;
    matchesLabel.dataset.current = String(current + 1);
    showMatches();
    jump(matches[current]);
  }
  $("log-next").addEventListener("click", () => step(1));
  $("log-prev").addEventListener("click", () => step(-1));

  // --- live ------------------------------------------------------------------------------------
  function received(rows) {
    for (const row of rows) {
      if (row[0] <= last) continue; // a replay after a reconnect: already received
      last = row[0];
      if (!wanted(row)) continue;
      if (following && atTail) queue.push(row);
      else {
        arrived += 1;
        atTail = false;
      }
    }
    if (queue.length > CAP) {
      // A hidden tab runs no frames: keep only what the window would show.
      queue = queue.slice(-CAP);
      moreBefore = true;
    }
    if (queue.length && !scheduled) {
      // At most one DOM write every FLUSH_MS, in a frame, however many events came: each
      // write lays the window (up to CAP lines) out again.
      scheduled = true;
      const wait = Math.max(0, flushed + FLUSH_MS - performance.now());
      setTimeout(() => requestAnimationFrame(flush), wait);
    }
    say();
  }
  const FLUSH_MS = 100;
  let scheduled = false;
  let flushed = 0;
  function flush() {
    scheduled = false;
    flushed = performance.now();
    if (!queue.length) return;
    let rows = queue;
    queue = [];
    if (!following) {
      // Scrolled up since these came: they wait in the stored log like the rest.
      arrived += rows.length;
      atTail = false;
      say();
      return;
    }
    if (rows.length > CAP) {
      rows = rows.slice(-CAP);
      moreBefore = true;
    }
    append(rows);
    if (count > CAP) {
      trim(true);
      moreBefore = true;
    }
    log.scrollTop = log.scrollHeight;
  }
  function refreshState() {
    document.body.dispatchEvent(new Event("launch-state"));
  }
  function ended() {
    // A banner about what was under way ("Stopping launch #N…") is done once the log ends.
    for (const banner of document.querySelectorAll(".message-transient")) banner.remove();
    stream = "ended";
    live = false;
    empty();
    say();
  }
  function poll() {
    // Fallback when the stream cannot be kept open: read stored lines every second.
    polling = setInterval(async () => {
      const response = await fetch(`${log.dataset.lines}?after=${last}`);
      if (response.status === 404) {
        // Gone, or no longer shown to this reader (its profile was given to a team).
        clearInterval(polling);
        stream = "ended";
        live = false;
        say();
        note("This launch is no longer shown to you: reload the page.");
        return;
      }
      if (!response.ok) return;
      const doc = await response.json();
      received(doc.lines);
      if (doc.ended && last >= doc.last_seq) {
        clearInterval(polling);
        ended();
      }
    }, 1000);
  }
  // The page came with its last lines as plain text; shown again through the one renderer.
  replace(
    [...log.querySelectorAll("span[data-seq]")].map((s) => [
      Number(s.dataset.seq), textOf(s), Number(s.dataset.level || 0), "", s.dataset.node || "",
    ]),
    { more_before: log.dataset.moreBefore === "true", more_after: false },
  );
  log.scrollTop = log.scrollHeight;
  say();
  if (lineOf(location.hash)) jump(lineOf(location.hash));
  if (!window.EventSource) {
    stream = "polling";
    say();
    poll();
    return;
  }
  const source = new EventSource(`${log.dataset.events}?after=${last}`);
  source.addEventListener("lines", (event) => {
    failures = 0;
    received(JSON.parse(event.data));
  });
  source.addEventListener("state", refreshState);
  source.addEventListener("end", () => {
    source.close();
    refreshState();
    ended();
  });
  source.onopen = () => {
    stream = "open";
    say();
  };
  source.onerror = () => {
    failures += 1;
    stream = "reconnecting";
    // A stream refused (not 200) is not retried by the browser: read by polling, which says why.
    if (failures >= 5 || source.readyState === EventSource.CLOSED) {
      source.close();
      stream = "polling";
      poll();
    }
    say();
  };
})();
