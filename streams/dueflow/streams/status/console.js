// The dueflow operator console: a page over the status view's JSON API.
// Every value from the API is written with textContent (never as HTML): job ids,
// task names, errors and payloads are data from any writer.
"use strict";

const $ = (sel) => document.querySelector(sel);
const state = { role: null, csrf: null, next: null, job: null, queues: [] };

function fmt(ms) {
  if (ms === null || ms === undefined) return "";
  const d = new Date(Number(ms));
  return isNaN(d) ? String(ms) : d.toISOString().replace("T", " ").slice(0, 23);
}

// "in 42 s" / "3 min ago": how far ms is from now (the status view's clock).
function relative(ms, now) {
  if (ms === null || ms === undefined || now === null || now === undefined) return "";
  const d = Number(ms) - Number(now);
  if (isNaN(d)) return "";
  const a = Math.abs(d);
  const span = a < 1000 ? `${a} ms` : a < 120000 ? `${Math.round(a / 1000)} s`
    : a < 7200000 ? `${Math.round(a / 60000)} min` : `${Math.round(a / 3600000)} h`;
  return d >= 0 ? `in ${span}` : `${span} ago`;
}

function say(text) { $("#message").textContent = text; }

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

async function api(method, path, body) {
  const opts = { method, credentials: "same-origin", headers: {} };
  if (method !== "GET") {
    opts.headers["Content-Type"] = "application/json";
    if (state.csrf) opts.headers["X-CSRF-Token"] = state.csrf;
    opts.body = JSON.stringify(body || {});
  }
  const resp = await fetch(path, opts);
  let doc = null;
  try { doc = await resp.json(); } catch (e) { doc = { error: `not JSON (${resp.status})` }; }
  if (resp.status === 401 && path !== "/api/login") showLogin(true);
  return { status: resp.status, doc };
}

// ----------------------------------------------------------------- session
function showLogin(show) {
  $("#login-form").hidden = !show;
  $("#logout").hidden = show;
}

function setSession(doc) {
  state.role = doc.role || null;
  state.csrf = doc.csrf || null;
  $("#who").textContent = state.csrf ? `${doc.who}` : (doc.role ? `${doc.role} (not logged in)` : "not logged in");
  $("#who").dataset.role = state.role || "";
  showLogin(!state.csrf);
  for (const b of document.querySelectorAll("[data-act], #redrive-go, button.pause"))
    b.dataset.operator = state.role === "operator" ? "yes" : "no";
}

async function loadSession() {
  const { status, doc } = await api("GET", "/api/session");
  setSession(status === 200 ? doc : {});
}

async function login(token, name) {
  const { status, doc } = await api("POST", "/api/login", { token, name });
  if (status !== 200) { say(`login refused (${status}): ${doc.error}`); return false; }
  setSession(doc);
  say(`logged in as ${doc.who}`);
  refreshAll();
  return true;
}

$("#login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const token = $("#login-token").value.trim();
  $("#login-token").value = "";
  if (token) await login(token, $("#login-name").value.trim());
});

$("#logout").addEventListener("click", async () => {
  await api("POST", "/api/logout", {});
  setSession({});
  say("logged out");
});

// ------------------------------------------------------------------- tabs
for (const b of document.querySelectorAll("button.tab")) {
  b.addEventListener("click", () => {
    for (const t of document.querySelectorAll("button.tab")) t.classList.toggle("active", t === b);
    for (const p of document.querySelectorAll(".tab-page")) p.hidden = p.id !== `tab-${b.dataset.tab}`;
    refreshAll();
  });
}

// ------------------------------------------------------------------ search
function searchParams() {
  const p = new URLSearchParams();
  const put = (k, sel) => { const v = $(sel).value.trim(); if (v) p.set(k, v); };
  put("state", "#f-state"); put("queue", "#f-queue"); put("task", "#f-task");
  put("id_prefix", "#f-id"); put("error", "#f-error");
  put("due_from", "#f-due-from"); put("due_to", "#f-due-to");
  return p;
}

async function search(more) {
  const p = searchParams();
  if (more && state.next) p.set("before", state.next);
  const { status, doc } = await api("GET", `/api/jobs?${p}`);
  const body = $("#jobs tbody");
  if (!more) body.replaceChildren();
  if (status !== 200) { say(`search refused (${status}): ${doc.error}`); return; }
  for (const j of doc.jobs) {
    const tr = document.createElement("tr");
    tr.dataset.jobId = j.job_id;
    const td = document.createElement("td");
    const a = document.createElement("button");
    a.type = "button"; a.className = "link open-job"; a.textContent = j.job_id;
    a.addEventListener("click", () => openJob(j.job_id));
    td.appendChild(a); tr.appendChild(td);
    cell(tr, j.queue); cell(tr, j.task);
    const st = cell(tr, j.state, "state"); st.dataset.state = j.state || "";
    cell(tr, j.attempts, "num"); cell(tr, fmt(j.due_ms)); cell(tr, fmt(j.updated_ms));
    cell(tr, j.last_error ? `${j.last_error.type || ""}: ${j.last_error.message || ""}` : "", "err");
    body.appendChild(tr);
  }
  state.next = doc.next;
  $("#more").hidden = !doc.next;
  $("#took").textContent = `${body.children.length} shown, ${doc.took_ms} ms`;
  say(body.children.length ? "" : "no job matches");
}

$("#search").addEventListener("submit", (ev) => { ev.preventDefault(); search(false); });
$("#more").addEventListener("click", () => search(true));

// ----------------------------------------------------------------- one job
async function openJob(jobId) {
  const { status, doc } = await api("GET", `/api/jobs/${encodeURIComponent(jobId)}`);
  if (status !== 200) { say(`job ${jobId}: ${doc.error}`); return; }
  state.job = doc.job;
  $("#job").hidden = false;
  $("#job-id").textContent = doc.job.job_id;
  $("#job-state").textContent = doc.job.state;
  $("#job-state").dataset.state = doc.job.state || "";
  const dl = $("#job-fields"); dl.replaceChildren();
  const field = (k, v) => {
    if (v === null || v === undefined || v === "") return;
    const dt = document.createElement("dt"); dt.textContent = k;
    const dd = document.createElement("dd"); dd.textContent = String(v);
    dl.append(dt, dd);
  };
  const j = doc.job;
  for (const k of ["queue", "task", "idempotency_key", "schedule_id", "attempts", "worker", "trace_id", "partition"])
    field(k, j[k]);
  for (const k of ["due_ms", "fired_ms", "started_ms", "finished_ms", "first_seen_ms", "updated_ms"])
    field(k.replace("_ms", ""), fmt(j[k]));
  if (j.state === "retrying" && j.next_due_ms !== null && j.next_due_ms !== undefined)
    field("next attempt due", `${fmt(j.next_due_ms)} (${relative(j.next_due_ms, doc.now_ms)})`);
  if (j.progress !== undefined) field("progress", JSON.stringify(j.progress));
  if (doc.trace_url) {
    const dt = document.createElement("dt"); dt.textContent = "trace";
    const dd = document.createElement("dd"); const a = document.createElement("a");
    a.href = doc.trace_url; a.rel = "noreferrer noopener"; a.target = "_blank";
    a.textContent = "open in the tracing UI"; dd.appendChild(a); dl.append(dt, dd);
  }
  const tl = $("#timeline tbody"); tl.replaceChildren();
  for (const e of doc.timeline) {
    const tr = document.createElement("tr");
    cell(tr, fmt(e.at_ms));
    const st = cell(tr, e.state, "state"); st.dataset.state = e.state;
    cell(tr, e.attempt || "", "num"); cell(tr, e.worker);
    if (e.state === "retry_due") {
      st.textContent = "retry due";
      cell(tr, `attempt ${e.attempt} not before this (${relative(e.at_ms, doc.now_ms)})`);
    } else {
      cell(tr, e.error || e.error_type ? `${e.error_type || ""}: ${e.error || ""}` : "", "err");
    }
    tl.appendChild(tr);
  }
  const at = $("#attempts tbody"); at.replaceChildren();
  for (const a of doc.attempts) {
    const tr = document.createElement("tr");
    cell(tr, a.attempt, "num"); cell(tr, a.worker); cell(tr, fmt(a.started_ms)); cell(tr, fmt(a.ended_ms));
    cell(tr, a.outcome);
    cell(tr, a.duration_ms === undefined ? "" : Number(a.duration_ms).toFixed(1), "num");
    cell(tr, a.error ? `${a.error.type || ""}: ${a.error.message || ""}` : "", "err");
    cell(tr, a.retry_due_ms === undefined ? "" : fmt(a.retry_due_ms));
    at.appendChild(tr);
  }
  $("#result").textContent = doc.result === undefined ? "(no result recorded)"
    : doc.result === null ? "(payloads and results are shown to operators)"
    : doc.result.text + (doc.result.truncated ? `\n… cut at ${doc.result.text.length} of ${doc.result.bytes} bytes` : "");
  $("#dead").replaceChildren();
  $("#payload").textContent = "";
}

$("#load-payload").addEventListener("click", async () => {
  if (!state.job) return;
  const { status, doc } = await api("GET", `/api/jobs/${encodeURIComponent(state.job.job_id)}/payload`);
  $("#payload").textContent = status !== 200 ? doc.error
    : doc.payload.text + (doc.payload.truncated ? `\n… cut, ${doc.payload.bytes} bytes in all` : "");
});

$("#load-dead").addEventListener("click", async () => {
  if (!state.job) return;
  const box = $("#dead"); box.replaceChildren();
  const { status, doc } = await api("GET", `/api/jobs/${encodeURIComponent(state.job.job_id)}/dead-letter`);
  if (status !== 200) { box.textContent = doc.error; return; }
  const d = doc.dead_letter;
  const pre = (label, text) => {
    const h = document.createElement("h4"); h.textContent = label;
    const p = document.createElement("pre"); p.className = "blob"; p.textContent = text;
    box.append(h, p);
  };
  pre("error", `${d.error_type}: ${d.error_message} (reason ${d.reason}, ${d.attempts} attempts, dead ${fmt(d.dead_ms)}, from ${d.original}, record ${d.ref})`);
  pre("traceback", d.traceback || "(none)");
  pre("payload", d.payload === null ? "(payloads are shown to operators)"
    : d.payload.text + (d.payload.truncated ? `\n… cut, ${d.payload.bytes} bytes in all` : ""));
});

async function act(button, path, body) {
  button.disabled = true;
  try {
    const { status, doc } = await api("POST", path, body);
    say(status === 200 ? `${doc.message}${doc.repeat ? " (repeat: done once)" : ""}` : `refused (${status}): ${doc.error}`);
    return status === 200 ? doc : null;
  } finally {
    button.disabled = false;
  }
}

for (const b of document.querySelectorAll("[data-act]")) {
  b.addEventListener("click", async () => {
    if (!state.job) return;
    const verb = b.dataset.act;
    const body = verb === "reschedule" ? { run_at: $("#run-at").value.trim() } : {};
    if (verb === "cancel" && !confirm(`Cancel job ${state.job.job_id}?`)) return;
    await act(b, `/api/jobs/${encodeURIComponent(state.job.job_id)}/${verb}`, body);
    setTimeout(() => openJob(state.job.job_id), 500);
  });
}

// ------------------------------------------------------------------ queues
async function loadQueues() {
  const { status, doc } = await api("GET", "/queues");
  if (status !== 200) return;
  const body = $("#queues tbody"); body.replaceChildren();
  const names = Object.keys(doc.queues);
  state.queues = names;
  const sel = $("#r-queue");
  if (sel.options.length !== names.length) {
    sel.replaceChildren(...names.map((n) => { const o = document.createElement("option"); o.textContent = n; return o; }));
  }
  for (const [name, q] of Object.entries(doc.queues)) {
    const tr = document.createElement("tr"); tr.dataset.queue = name;
    cell(tr, name);
    cell(tr, q.paused ? "paused" : "running", q.paused ? "paused" : "");
    for (const s of ["scheduled", "started", "retrying", "succeeded", "dead"]) cell(tr, q.counts[s] || 0, "num");
    cell(tr, q.lag, "num"); cell(tr, q.dlq_depth, "num");
    const td = document.createElement("td"); const b = document.createElement("button");
    b.type = "button"; b.className = "pause"; b.dataset.queue = name;
    b.textContent = q.paused ? "Resume" : "Pause";
    b.addEventListener("click", async () => {
      const verb = q.paused ? "resume" : "pause";
      await act(b, `/api/queues/${encodeURIComponent(name)}/${verb}`, { reason: "from the console" });
      loadQueues();
    });
    td.appendChild(b); tr.appendChild(td); body.appendChild(tr);
  }
}

// --------------------------------------------------------------------- DLQ
function redriveBody(dryRun) {
  const filter = {};
  const put = (k, sel) => { const v = $(sel).value.trim(); if (v) filter[k] = v; };
  put("task", "#r-task"); put("error_type", "#r-error-type"); put("since", "#r-since");
  return { filter, dry_run: dryRun };
}

let previewed = null;
$("#redrive").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const queue = $("#r-queue").value;
  const body = redriveBody(true);
  const doc = await act($("#redrive button[type=submit]"), `/api/dlq/${encodeURIComponent(queue)}/redrive`, body);
  const tb = $("#redrive-items tbody"); tb.replaceChildren();
  if (!doc) return;
  previewed = { queue, filter: body.filter, count: doc.would_redrive };
  $("#redrive-preview").textContent = `${doc.would_redrive} dead letters would be redriven`;
  $("#redrive-go").disabled = doc.would_redrive === 0;
  $("#redrive-go").textContent = `Redrive ${doc.would_redrive}`;
  for (const i of doc.items) {
    const tr = document.createElement("tr");
    cell(tr, i.ref); cell(tr, i.job_id); cell(tr, i.task);
    cell(tr, `${i.error_type}: ${i.error_message}`, "err"); cell(tr, fmt(i.dead_ms)); cell(tr, i.why);
    tb.appendChild(tr);
  }
});

$("#redrive-go").addEventListener("click", async () => {
  if (!previewed) return;
  const b = $("#redrive-go");
  if (!confirm(`Redrive ${previewed.count} dead letters of ${previewed.queue}?`)) return;
  const doc = await act(b, `/api/dlq/${encodeURIComponent(previewed.queue)}/redrive`,
    { filter: previewed.filter, dry_run: false, limit: Math.max(1, previewed.count) });
  if (doc) { $("#redrive-preview").textContent = doc.message; b.disabled = true; previewed = null; }
});

let purgePlan = null;
$("#purge").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const queue = $("#r-queue").value;
  const before = $("#p-before").value.trim();
  const doc = await act($("#purge button[type=submit]"), `/api/dlq/${encodeURIComponent(queue)}/purge`,
    { before, dry_run: true });
  if (!doc) return;
  purgePlan = { queue, before, count: doc.records };
  $("#purge-preview").textContent = `${doc.records} dead letters of ${queue} would be deleted`;
  $("#purge-go").disabled = doc.records === 0;
});

$("#purge-go").addEventListener("click", async () => {
  if (!purgePlan) return;
  if (!confirm(`Delete ${purgePlan.count} dead letters of ${purgePlan.queue}? They cannot be redriven after.`)) return;
  const doc = await act($("#purge-go"), `/api/dlq/${encodeURIComponent(purgePlan.queue)}/purge`,
    { before: purgePlan.before, dry_run: false });
  if (doc) { $("#purge-preview").textContent = doc.message; $("#purge-go").disabled = true; purgePlan = null; }
});

// ------------------------------------------------------------------- watch
async function loadWatch() {
  const { status, doc } = await api("GET", "/api/watch");
  if (status !== 200) return;
  const em = doc.emitter;
  $("#emitter").textContent = em ? `emitter: ${em.leader ? `active ${em.leader}` : "NO ACTIVE EMITTER"}; ${em.members} members, group ${em.group_state}` : "emitter: not read yet";
  const body = $("#watch tbody"); body.replaceChildren();
  for (const [name, q] of Object.entries(doc.queues)) {
    const tr = document.createElement("tr"); tr.dataset.queue = name;
    cell(tr, name); cell(tr, q.done_per_min, "num"); cell(tr, q.start_late_p50_ms, "num");
    cell(tr, q.start_late_p99_ms, "num"); cell(tr, q.retries, "num"); cell(tr, q.dead, "num");
    cell(tr, q.lag, "num"); body.appendChild(tr);
  }
  const cb = $("#crons tbody"); cb.replaceChildren();
  for (const c of doc.schedules || []) {
    const tr = document.createElement("tr"); tr.dataset.schedule = c.schedule_id;
    cell(tr, c.schedule_id); cell(tr, c.cron); cell(tr, c.timezone); cell(tr, c.queue); cell(tr, c.task);
    cell(tr, c.paused ? "paused" : "active", c.paused ? "paused" : "");
    cell(tr, (c.next_runs || []).join("  ·  "));
    const td = document.createElement("td"); const b = document.createElement("button");
    b.type = "button"; b.textContent = c.paused ? "Resume" : "Pause";
    b.addEventListener("click", async () => {
      await act(b, `/api/schedules/${encodeURIComponent(c.schedule_id)}/${c.paused ? "resume" : "pause"}`, {});
      loadWatch();
    });
    td.appendChild(b); tr.appendChild(td); cb.appendChild(tr);
  }
}

// ----------------------------------------------------------------- actions
async function loadActions() {
  const { status, doc } = await api("GET", "/api/actions");
  if (status !== 200) return;
  const body = $("#actions tbody"); body.replaceChildren();
  for (const a of doc.actions) {
    const tr = document.createElement("tr");
    cell(tr, fmt(a.at_ms)); cell(tr, a.who); cell(tr, a.action); cell(tr, a.target);
    cell(tr, a.done ? "yes" : "no"); cell(tr, a.message);
    body.appendChild(tr);
  }
}

function current() {
  const t = document.querySelector("button.tab.active");
  return t ? t.dataset.tab : "jobs";
}

function refreshAll() {
  const tab = current();
  if (tab === "queues" || tab === "dlq") loadQueues();
  if (tab === "watch") loadWatch();
  if (tab === "actions") loadActions();
}

setInterval(() => { if (current() !== "jobs") refreshAll(); }, 2000);

(async () => {
  // A token handed over in the URL's fragment (never sent to the server, so in no
  // log): logged in with, then taken out of the address bar.
  const hash = new URLSearchParams(location.hash.slice(1));
  const token = hash.get("token");
  if (token) {
    history.replaceState(null, "", location.pathname);
    await login(token, "");
  } else {
    await loadSession();
  }
  loadQueues();
  search(false);
})();
