// Rankwise keeps JavaScript to a minimum: htmx does the work. The one exception is the live
// launch log, which follows a Server-Sent Events stream (EventSource reconnects by itself and
// sends Last-Event-ID, so the server resumes after the last line shown).
(function () {
  const log = document.getElementById("launch-log");
  if (!log) return;
  // The diagnosis names its evidence by line number: mark those lines in the viewer.
  function highlight() {
    for (const item of document.querySelectorAll("[data-evidence-line]")) {
      const line = document.getElementById(`line-${item.dataset.evidenceLine}`);
      if (line) line.classList.add("evidence");
    }
  }
  document.body.addEventListener("htmx:afterSettle", highlight);
  const status = document.getElementById("log-status");
  let last = Number(log.dataset.lastSeq || 0);
  let failures = 0;
  let polling = null;

  function atBottom() {
    return log.scrollHeight - log.scrollTop - log.clientHeight < 40;
  }
  function append(rows) {
    const follow = atBottom();
    const frag = document.createDocumentFragment();
    for (const [seq, text] of rows) {
      if (seq <= last) continue; // a replay after a reconnect: already shown
      const span = document.createElement("span");
      span.dataset.seq = seq;
      span.id = `line-${seq}`;
      span.textContent = text + "\n";
      frag.appendChild(span);
      last = seq;
    }
    log.appendChild(frag);
    if (follow) log.scrollTop = log.scrollHeight;
  }
  function refreshState() {
    document.body.dispatchEvent(new Event("launch-state"));
  }
  function poll() {
    // Fallback when the stream cannot be kept open: read stored lines every second.
    polling = setInterval(async () => {
      const response = await fetch(`${log.dataset.lines}?after=${last}`);
      if (!response.ok) return;
      const doc = await response.json();
      append(doc.lines);
      if (doc.ended && last >= doc.last_seq) { clearInterval(polling); ended(); }
    }, 1000);
  }
  if (!window.EventSource) { poll(); return; }
  const source = new EventSource(`${log.dataset.events}?after=${last}`);
  source.addEventListener("lines", (event) => { failures = 0; append(JSON.parse(event.data)); });
  source.addEventListener("state", refreshState);
  function ended() {
    // A banner about what was under way ("Stopping launch #N…") is done once the log ends.
    for (const note of document.querySelectorAll(".message-transient")) note.remove();
    status.textContent = "Log complete.";
  }
  source.addEventListener("end", () => { source.close(); refreshState(); ended(); });
  source.onopen = () => { status.textContent = "Following live."; };
  source.onerror = () => {
    failures += 1;
    status.textContent = "Reconnecting…";
    if (failures >= 5) { source.close(); status.textContent = "Following by polling."; poll(); }
  };
  log.scrollTop = log.scrollHeight;
})();
