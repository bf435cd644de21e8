// pymq console: one websocket to the broker's admin channel (docs/admin-protocol.md).
// No build step and no dependencies.  Live views subscribe to streams; nothing polls.
"use strict";

// -- the channel ------------------------------------------------------------------------------

const channel = {
  ws: null,
  nextId: 1,
  pending: new Map(), // request id -> {resolve, reject}
  handlers: new Map(), // subscription id -> callback(data)
  authenticated: false,

  connect(token) {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${proto}//${location.host}/ws`);
    this.ws = ws;
    ws.onopen = async () => {
      try {
        await this.request("auth", { token });
        sessionStorage.setItem("pymq-token", token);
        this.authenticated = true;
        setConnection(true);
        $("#login").hidden = true;
        app.start();
      } catch (err) {
        showLogin(`Not accepted: ${err.message}`);
      }
    };
    ws.onmessage = (event) => this.receive(JSON.parse(event.data));
    ws.onclose = () => {
      setConnection(false);
      for (const { reject } of this.pending.values()) reject(new Error("connection closed"));
      this.pending.clear();
      this.handlers.clear();
      if (this.authenticated) setTimeout(() => this.connect(token), 2000);
    };
  },

  receive(message) {
    if (message.type === "event") {
      const handler = this.handlers.get(message.subscription);
      if (handler) handler(message.data);
      return;
    }
    const waiter = this.pending.get(message.id);
    if (!waiter) return;
    this.pending.delete(message.id);
    if (message.ok) waiter.resolve(message.result);
    else {
      const err = new Error(message.error.message);
      err.code = message.error.code;
      waiter.reject(err);
    }
  },

  request(type, params = {}) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.ws.send(JSON.stringify({ id, type, params }));
    });
  },

  // Subscribe to a stream; returns a function that unsubscribes.
  subscribe(stream, params, callback, interval = 1) {
    const id = this.nextId++;
    this.handlers.set(id, callback);
    this.pending.set(id, { resolve: () => {}, reject: (e) => toast(e.message, true) });
    this.ws.send(JSON.stringify({ id, type: "subscribe", params: { stream, params, interval } }));
    return () => {
      this.handlers.delete(id);
      if (this.ws.readyState === WebSocket.OPEN) {
        this.request("unsubscribe", { subscription: id }).catch(() => {});
      }
    };
  },
};

// -- helpers ----------------------------------------------------------------------------------

const $ = (selector) => document.querySelector(selector);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child ?? "")));
  }
  return node;
}

function td(value, numeric = false) {
  return el("td", numeric ? { class: "num" } : {}, value);
}

function fmtTime(ms) {
  return ms > 0 ? new Date(ms).toLocaleString() : "-";
}

function fmtNum(n) {
  return typeof n === "number" ? n.toLocaleString() : n ?? "-";
}

function setConnection(ok) {
  const node = $("#conn");
  node.textContent = ok ? "connected" : "disconnected";
  node.classList.toggle("ok", ok);
}

let toastTimer = null;
function toast(text, bad = false) {
  const node = $("#toast");
  node.textContent = text;
  node.className = bad ? "show bad" : "show";
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => (node.className = ""), 3500);
}

// Resolves true when the operator confirms in the dialog.
function confirmAction(text) {
  const dialog = $("#confirm");
  $("#confirm-text").textContent = text;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

async function act(text, work, done) {
  if (!(await confirmAction(text))) return;
  try {
    const result = await work();
    toast(done);
    return result;
  } catch (err) {
    toast(`${err.code || "error"}: ${err.message}`, true);
  }
}

function showLogin(error = "") {
  $("#login").hidden = false;
  $("#login-error").textContent = error;
  setConnection(false);
}

// -- views ------------------------------------------------------------------------------------

const app = {
  view: null,
  subscriptions: [], // unsubscribe functions of the current view
  detail: [], // ... and of its detail panel

  start() {
    for (const button of document.querySelectorAll("nav button")) {
      button.onclick = () => this.show(button.dataset.view);
    }
    this.show(location.hash.startsWith("#view=") ? location.hash.slice(6) : "overview");
  },

  show(view) {
    for (const off of [...this.subscriptions, ...this.detail]) off();
    this.subscriptions = [];
    this.detail = [];
    this.view = view;
    for (const section of document.querySelectorAll(".view")) {
      section.hidden = section.id !== `view-${view}`;
    }
    for (const button of document.querySelectorAll("nav button")) {
      button.classList.toggle("active", button.dataset.view === view);
    }
    views[view].enter(this);
  },

  watch(stream, params, callback, interval = 1) {
    this.subscriptions.push(channel.subscribe(stream, params, callback, interval));
  },

  watchDetail(stream, params, callback, interval = 1) {
    for (const off of this.detail) off();
    this.detail = [channel.subscribe(stream, params, callback, interval)];
  },
};

// Overview: broker cards, a live TPS chart, and the cluster table.
const tpsHistory = [];
const TPS_POINTS = 120;

function drawChart() {
  const canvas = $("#tps-chart");
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || 900;
  const height = canvas.clientHeight || 220;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, height);
  const max = Math.max(1, ...tpsHistory.flatMap((p) => [p.put, p.get]));
  ctx.strokeStyle = "#e5e7eb";
  ctx.fillStyle = "#6b7280";
  ctx.font = "11px system-ui";
  for (let i = 0; i <= 4; i++) {
    const y = 10 + ((height - 30) * i) / 4;
    ctx.beginPath();
    ctx.moveTo(40, y);
    ctx.lineTo(width, y);
    ctx.stroke();
    ctx.fillText(((max * (4 - i)) / 4).toFixed(max < 10 ? 1 : 0), 2, y + 4);
  }
  const line = (key, color) => {
    ctx.strokeStyle = color;
    ctx.lineWidth = 2;
    ctx.beginPath();
    tpsHistory.forEach((p, i) => {
      const x = 40 + ((width - 40) * i) / (TPS_POINTS - 1);
      const y = 10 + (height - 30) * (1 - p[key] / max);
      if (i === 0) ctx.moveTo(x, y);
      else ctx.lineTo(x, y);
    });
    ctx.stroke();
  };
  line("put", getComputedStyle(document.body).getPropertyValue("--put") || "#2563eb");
  line("get", getComputedStyle(document.body).getPropertyValue("--get") || "#16a34a");
}

const views = {
  overview: {
    enter(app) {
      app.watch("broker.status", {}, (s) => {
        tpsHistory.push({ put: s.putTps, get: s.getTps });
        while (tpsHistory.length > TPS_POINTS) tpsHistory.shift();
        drawChart();
        $("#tps-now").textContent = `now: put ${s.putTps.toFixed(1)}/s, get ${s.getTps.toFixed(1)}/s`;
        const cards = [
          ["Broker", `${s.brokerName} (${s.clusterName})`],
          ["Role", s.brokerRole],
          ["Version", `${s.brokerVersionDesc} / pymq ${s.pymqVersion}`],
          ["Put TPS", s.putTps.toFixed(1)],
          ["Get TPS", s.getTps.toFixed(1)],
          ["Messages in", fmtNum(s.msgPutTotal)],
          ["Messages out", fmtNum(s.msgGetTotal)],
          ["Disk used", `${(s.commitLogDiskRatio * 100).toFixed(1)} %`],
          ["Commit log", `${fmtNum(s.commitLogMaxOffset)} B`],
          ["Slave lag", s.slaveLag == null ? "n/a" : fmtNum(s.slaveLag)],
        ];
        $("#cards").replaceChildren(
          ...cards.map(([k, v]) =>
            el("div", { class: "card" }, el("div", { class: "k" }, k), el("div", { class: "v" }, v)),
          ),
        );
      });
      app.watch(
        "cluster.status",
        {},
        (c) => {
          $("#cluster-table tbody").replaceChildren(
            ...c.brokers.map((b) =>
              el(
                "tr",
                {},
                td(b.clusterName),
                td(b.brokerName),
                td(b.brokerId),
                td(b.brokerAddr),
                td(b.online ? b.brokerRole : "offline"),
                td(b.brokerVersionDesc),
                td((b.putTps ?? 0).toFixed(1), true),
                td((b.getTps ?? 0).toFixed(1), true),
                td(b.commitLogDiskRatio == null ? "-" : `${(b.commitLogDiskRatio * 100).toFixed(1)} %`, true),
                td(b.slaveLag == null ? "n/a" : b.slaveLag, true),
              ),
            ),
          );
        },
        2,
      );
      // DLedger mode: each group's members, term, leader, committed index, followers' lag.
      app.watch(
        "dledger.status",
        {},
        (d) => {
          $("#dledger-panel").hidden = d.groups.length === 0;
          $("#dledger-summary").replaceChildren(
            ...d.groups.map((g) =>
              el(
                "p",
                { dataset: { group: g.group } },
                `${g.brokerName} / ${g.group}: term ${g.term ?? "-"}, leader ${g.leaderId ?? "none"}, ` +
                  `committed index ${g.committedIndex ?? "-"}`,
              ),
            ),
          );
          $("#dledger-table tbody").replaceChildren(
            ...d.groups.flatMap((g) =>
              g.members.map((m) =>
                el(
                  "tr",
                  { dataset: { member: m.selfId } },
                  td(g.brokerName),
                  td(g.group),
                  td(m.selfId),
                  td(m.brokerAddr ?? "unreachable"),
                  td(m.brokerId ?? "-"),
                  td(m.online ? m.role : "offline"),
                  td(m.term ?? "-", true),
                  td(m.ledgerEndIndex ?? "-", true),
                  td(m.committedIndex ?? "-", true),
                  td(m.lag ?? "-", true),
                ),
              ),
            ),
          );
        },
        2,
      );
    },
  },

  // Topics: a virtual-scrolling table (only visible rows are in the DOM), so 10,000 topics
  // filter and sort without stalling the page.
  topics: {
    all: [],
    rows: [],
    sort: { key: "topic", dir: 1 },
    selected: null,
    wired: false,

    enter(app) {
      if (!this.wired) this.wire();
      app.watch("topic.list", {}, (topics) => {
        this.all = topics;
        this.refresh();
      });
      if (this.selected) this.select(this.selected);
    },

    wire() {
      this.wired = true;
      $("#topic-filter").addEventListener("input", () => this.refresh());
      $("#topic-system").addEventListener("change", () => this.refresh());
      $("#topic-scroll").addEventListener("scroll", () => this.paint());
      for (const span of document.querySelectorAll(".vhead span")) {
        span.addEventListener("click", () => {
          const key = span.dataset.sort;
          this.sort = { key, dir: this.sort.key === key ? -this.sort.dir : 1 };
          this.refresh();
        });
      }
      $("#topic-create").addEventListener("submit", async (event) => {
        event.preventDefault();
        const form = event.target;
        const topic = form.topic.value.trim();
        const queues = Number(form.queues.value);
        const perm = Number(form.perm.value);
        const done = await act(
          `Create topic ${topic} with ${queues} queues?`,
          () => channel.request("topic.update", { topic, readQueueNums: queues, writeQueueNums: queues, perm }),
          `Topic ${topic} created`,
        );
        if (done) form.topic.value = "";
      });
      $("#topic-update").addEventListener("click", () => {
        const topic = this.selected;
        const params = {
          topic,
          readQueueNums: Number($("#topic-read").value),
          writeQueueNums: Number($("#topic-write").value),
          perm: Number($("#topic-perm").value),
        };
        act(
          `Update ${topic}: ${params.readQueueNums} read / ${params.writeQueueNums} write queues, perm ${params.perm}?`,
          () => channel.request("topic.update", params),
          `Topic ${topic} updated`,
        );
      });
      $("#topic-delete").addEventListener("click", async () => {
        const topic = this.selected;
        const done = await act(
          `Delete topic ${topic} and its messages? This cannot be undone.`,
          () => channel.request("topic.delete", { topic }),
          `Topic ${topic} deleted`,
        );
        if (done) {
          this.selected = null;
          $("#topic-detail").hidden = true;
          for (const off of app.detail) off();
        }
      });
    },

    refresh() {
      const needle = $("#topic-filter").value.trim().toLowerCase();
      const system = $("#topic-system").checked;
      const { key, dir } = this.sort;
      this.rows = this.all
        .filter((t) => (system || !t.system) && (!needle || t.topic.toLowerCase().includes(needle)))
        .sort((a, b) => (a[key] < b[key] ? -dir : a[key] > b[key] ? dir : 0));
      $("#topic-count").textContent = `${this.rows.length} of ${this.all.length} topics`;
      for (const span of document.querySelectorAll(".vhead span")) {
        span.className = span.dataset.sort === key ? (dir > 0 ? "asc" : "desc") : "";
      }
      this.paint(true);
    },

    paint(force = false) {
      const scroll = $("#topic-scroll");
      const rowHeight = 28;
      const first = Math.max(0, Math.floor(scroll.scrollTop / rowHeight) - 5);
      const count = Math.ceil(scroll.clientHeight / rowHeight) + 10;
      const key = `${first}:${count}:${this.rows.length}`;
      if (!force && key === this.painted) return;
      this.painted = key;
      const spacer = $("#topic-spacer");
      spacer.style.height = `${this.rows.length * rowHeight}px`;
      const visible = this.rows.slice(first, first + count).map((t, i) =>
        el(
          "div",
          {
            class: t.topic === this.selected ? "vrow selected" : "vrow",
            style: `top:${(first + i) * rowHeight}px`,
            dataset: { topic: t.topic },
            onclick: () => this.select(t.topic),
          },
          el("span", {}, t.topic),
          el("span", {}, t.readQueueNums),
          el("span", {}, t.writeQueueNums),
          el("span", {}, t.permText),
          el("span", {}, t.order ? "yes" : "no"),
        ),
      );
      spacer.replaceChildren(...visible);
    },

    select(topic) {
      this.selected = topic;
      this.paint(true);
      const config = this.all.find((t) => t.topic === topic);
      $("#topic-detail").hidden = false;
      $("#topic-name").textContent = topic;
      if (config) {
        $("#topic-read").value = config.readQueueNums;
        $("#topic-write").value = config.writeQueueNums;
        $("#topic-perm").value = String(config.perm);
      }
      app.watchDetail("topic.status", { topic }, (status) => {
        if (status.error) {
          $("#queue-table tbody").replaceChildren(el("tr", {}, el("td", { colspan: 4 }, status.error.message)));
          return;
        }
        $("#queue-table tbody").replaceChildren(
          ...status.queues.map((q) =>
            el("tr", {}, td(q.queueId), td(fmtNum(q.minOffset), true), td(fmtNum(q.maxOffset), true), td(fmtTime(q.lastUpdateTimestamp))),
          ),
        );
      });
    },
  },

  // Consumer groups: live lag for all groups, and per-queue progress of the selected one.
  groups: {
    selected: null,
    wired: false,

    enter(app) {
      if (!this.wired) this.wire();
      app.watch("group.list", {}, (groups) => {
        $("#group-table tbody").replaceChildren(
          ...groups.map((g) =>
            el(
              "tr",
              {
                class: g.group === this.selected ? "clickable selected" : "clickable",
                dataset: { group: g.group },
                onclick: () => this.select(g.group),
              },
              td(g.group),
              td(g.online ? "yes" : "no"),
              td(g.members.length),
              td(g.messageModel ?? "-"),
              td(g.rebalance),
              td(g.topics.join(", ")),
              el("td", { class: "num", "data-testid": `lag-${g.group}` }, fmtNum(g.diffTotal)),
            ),
          ),
        );
      });
      if (this.selected) this.select(this.selected);
    },

    async loadDeadLetters() {
      const group = this.selected;
      const page = await channel.request("dlq.messages", { group, offset: 0, maxNum: 64 });
      $("#dlq-range").textContent = `${page.topic}: offsets ${page.minOffset}–${page.maxOffset}`;
      $("#dlq-table tbody").replaceChildren(
        ...page.messages.map((m) =>
          el(
            "tr",
            {},
            td(m.queueOffset, true),
            td(m.msgId),
            td(m.properties.RETRY_TOPIC ?? "-"),
            td(fmtTime(m.storeTimestamp)),
            td((m.bodyPreview ?? "").slice(0, 60)),
            el(
              "td",
              {},
              el(
                "button",
                {
                  "data-testid": `dlq-resend-${m.queueOffset}`,
                  onclick: () =>
                    act(
                      `Send dead letter ${m.msgId} back to ${group} to be consumed again?`,
                      () => channel.request("dlq.resend", { group, offset: m.queueOffset }),
                      `Resent to %RETRY%${group}`,
                    ),
                },
                "Resend",
              ),
            ),
          ),
        ),
      );
    },

    wire() {
      this.wired = true;
      $("#dlq-load").addEventListener("click", () =>
        this.loadDeadLetters().catch((err) => toast(err.message, true)),
      );
      $("#reset-offset").addEventListener("click", () => {
        const group = this.selected;
        const topic = $("#reset-topic").value;
        const when = $("#reset-time").value;
        const timestamp = when ? new Date(when).getTime() : 0;
        if (!topic) return toast("the group consumes no topic yet", true);
        act(
          `Reset ${group} on ${topic} to ${when ? new Date(timestamp).toLocaleString() : "the earliest message"}?`,
          () => channel.request("group.resetOffsetByTime", { group, topic, timestamp }),
          `Offsets of ${group} reset`,
        );
      });
    },

    select(group) {
      this.selected = group;
      $("#group-detail").hidden = false;
      $("#group-name").textContent = group;
      for (const row of document.querySelectorAll("#group-table tbody tr")) {
        row.classList.toggle("selected", row.dataset.group === group);
      }
      app.watchDetail("group.progress", { group }, (p) => {
        if (p.error) {
          $("#group-lag").textContent = p.error.message;
          return;
        }
        $("#group-lag").textContent = fmtNum(p.diffTotal);
        const topics = [...new Set(p.queues.map((q) => q.topic))];
        const select = $("#reset-topic");
        if ([...select.options].map((o) => o.value).join() !== topics.join()) {
          select.replaceChildren(...topics.map((t) => el("option", { value: t }, t)));
        }
        $("#progress-table tbody").replaceChildren(
          ...p.queues.map((q) =>
            el("tr", {}, td(q.topic), td(q.queueId), td(fmtNum(q.brokerOffset), true), td(fmtNum(q.consumerOffset), true), td(fmtNum(q.lag), true), td(fmtTime(q.lastTimestamp))),
          ),
        );
      });
      $("#dlq-table tbody").replaceChildren();
      $("#dlq-range").textContent = "";
      channel
        .request("group.connections", { group })
        .then((c) => $("#group-members").replaceChildren(...c.connectionSet.map((m) => el("li", {}, `${m.clientId} (${m.clientAddr}, ${m.language})`))))
        .catch(() => $("#group-members").replaceChildren(el("li", {}, "no member online")));
    },
  },

  // Messages: search by key, id or queue offset; click a result for its detail.
  messages: {
    wired: false,

    enter() {
      if (this.wired) return;
      this.wired = true;
      const form = $("#msg-search");
      const byOffset = () => {
        for (const input of document.querySelectorAll(".by-offset")) input.hidden = form.by.value !== "offset";
        form.key.hidden = form.by.value === "offset";
        form.topic.placeholder = form.by.value === "trace" ? "Trace topic (default)" : "Topic";
      };
      form.by.addEventListener("change", byOffset);
      byOffset();
      form.addEventListener("submit", async (event) => {
        event.preventDefault();
        $("#msg-error").textContent = "";
        $("#msg-detail").hidden = true;
        const topic = form.topic.value.trim();
        $("#trace-table").hidden = form.by.value !== "trace";
        $("#msg-table").hidden = form.by.value === "trace";
        try {
          let found;
          if (form.by.value === "trace") {
            const params = { msgId: form.key.value.trim() };
            if (topic) params.traceTopic = topic;
            this.trace(await channel.request("message.trace", params));
            return;
          }
          if (form.by.value === "key") {
            found = await channel.request("message.byKey", { topic, key: form.key.value.trim() });
          } else if (form.by.value === "id") {
            const params = { msgId: form.key.value.trim() };
            if (topic) params.topic = topic;
            found = [await channel.request("message.byId", params)];
          } else {
            found = [await channel.request("message.byOffset", { topic, queueId: Number(form.queueId.value), offset: Number(form.offset.value) })];
          }
          this.results(found);
        } catch (err) {
          $("#msg-table tbody").replaceChildren();
          $("#trace-table tbody").replaceChildren();
          $("#msg-error").textContent = `${err.code || "error"}: ${err.message}`;
        }
      });
    },

    // A message's trace: publish, then each consume-before / consume-after, with hosts,
    // times and costs.
    trace(steps) {
      const names = { Pub: "Publish", SubBefore: "Consume (before)", SubAfter: "Consume (after)", EndTransaction: "End transaction" };
      $("#trace-table tbody").replaceChildren(
        ...steps.map((s) => {
          const details = s.type === "Pub"
            ? `topic ${s.topic}, tags ${s.tags || "-"}, keys ${s.keys || "-"}, stored on ${s.storeHost || "-"}`
            : s.type === "SubBefore" ? `retry ${s.retryTimes}, request ${s.requestId}` : `request ${s.requestId}`;
          return el(
            "tr",
            {},
            td(names[s.type] || s.type),
            td(s.group),
            td(s.clientHost),
            td(s.timestamp ? fmtTime(s.timestamp) : "-"),
            td(s.type === "SubBefore" ? "-" : `${s.costTime} ms`),
            td(s.type === "SubBefore" ? "-" : s.status),
            td(details),
          );
        }),
      );
    },

    results(messages) {
      if (!messages.length) $("#msg-error").textContent = "no message found";
      $("#msg-table tbody").replaceChildren(
        ...messages.map((m) =>
          el(
            "tr",
            { class: "clickable", onclick: () => this.detail(m) },
            td(m.msgId),
            td(m.queueId),
            td(m.queueOffset, true),
            td(m.tags ?? "-"),
            td((m.keys || []).join(" ")),
            td(fmtTime(m.storeTimestamp)),
            td((m.bodyPreview ?? "").slice(0, 60)),
          ),
        ),
      );
      if (messages.length === 1) this.detail(messages[0]);
    },

    detail(m) {
      $("#msg-detail").hidden = false;
      const fields = [
        ["Message id", m.msgId], ["Unique key", m.uniqKey], ["Topic", m.topic], ["Tags", m.tags],
        ["Keys", (m.keys || []).join(" ")], ["Queue", m.queueId], ["Queue offset", m.queueOffset],
        ["Commit-log offset", m.commitLogOffset], ["Born", `${fmtTime(m.bornTimestamp)} from ${m.bornHost}`],
        ["Stored", `${fmtTime(m.storeTimestamp)} on ${m.storeHost}`], ["Reconsume times", m.reconsumeTimes],
        ["Body length", m.bodyLength], ["Properties", JSON.stringify(m.properties)],
      ];
      $("#msg-fields").replaceChildren(...fields.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v ?? "-")]));
      $("#msg-body").textContent = (m.bodyPreview ?? "(not loaded)") + (m.bodyTruncated ? "\n…" : "");
      $("#msg-track tbody").replaceChildren();
      channel
        .request("message.track", { msgId: m.msgId, topic: m.topic })
        .then((t) =>
          $("#msg-track tbody").replaceChildren(
            ...t.tracks.map((x) =>
              el("tr", {}, td(x.group), td(x.trackType), td(fmtNum(x.consumerOffset), true), td(x.online ? "yes" : "no")),
            ),
          ),
        )
        .catch((err) => $("#msg-track tbody").replaceChildren(el("tr", {}, td(err.message))));
    },
  },

  // Producers: the producer groups connected to this broker and their clients.
  producers: {
    async enter() {
      const groups = await channel.request("producer.list");
      $("#producer-table tbody").replaceChildren(
        ...groups.flatMap((g) =>
          g.connectionSet.map((c) =>
            el("tr", {}, td(g.group), td(c.clientId), td(c.clientAddr), td(c.language), td(c.version)),
          ),
        ),
      );
    },
  },

  // Transactions: half messages waiting for an outcome, checks and discards, pushed live.
  transactions: {
    enter(app) {
      app.watch("transactions.status", {}, (t) => {
        if (t.error) {
          $("#tx-summary tbody").replaceChildren(el("tr", {}, el("td", { colspan: 8 }, t.error.message)));
          return;
        }
        const waiting = fmtNum(t.pendingTotal) + (t.pendingTruncated ? "+" : "");
        const round = t.rounds
          ? `${new Date(t.lastRoundMs).toLocaleTimeString()}: ${t.lastRoundChecked} checked of ${t.lastRoundWalked} read in ${t.lastRoundDurationMs.toFixed(1)} ms`
          : "none yet";
        $("#tx-settings").textContent =
          `check every ${t.transactionCheckInterval} ms, after ${t.transactionTimeOut} ms, at most ${t.transactionCheckMax} times` +
          (t.checkService ? "" : " (a slave: no check service)") +
          (t.rejectTransactionMessage ? "; transactional messages are refused" : "");
        $("#tx-summary tbody").replaceChildren(
          el(
            "tr",
            {},
            el("td", { class: "num", "data-testid": "tx-waiting" }, waiting),
            el("td", { class: "num", "data-testid": "tx-committed" }, fmtNum(t.committed)),
            td(fmtNum(t.rolledBack), true),
            td(fmtNum(t.unknown), true),
            el("td", { class: "num", "data-testid": "tx-checks" }, fmtNum(t.checks)),
            td(fmtNum(t.checksWithoutProducer), true),
            el("td", { class: "num", "data-testid": "tx-discarded" }, fmtNum(t.discardedTotal)),
            td(round),
          ),
        );
        const behind = (end, at) => (at < 0 ? end : Math.max(0, end - at));
        $("#tx-progress tbody").replaceChildren(
          el("tr", {}, td("RMQ_SYS_TRANS_HALF_TOPIC"), td(fmtNum(t.halfMaxOffset), true), td(fmtNum(t.halfCheckOffset), true), td(fmtNum(behind(t.halfMaxOffset, t.halfCheckOffset)), true)),
          el("tr", {}, td("RMQ_SYS_TRANS_OP_HALF_TOPIC"), td(fmtNum(t.opMaxOffset), true), td(fmtNum(t.opCheckOffset), true), td(fmtNum(behind(t.opMaxOffset, t.opCheckOffset)), true)),
        );
        $("#tx-topics tbody").replaceChildren(
          ...Object.entries(t.pendingByTopic).map(([topic, n]) => el("tr", {}, td(topic), td(fmtNum(n), true))),
        );
      });
    },
  },

  // Timers: pending timer messages by topic and the next due time, pushed live.
  timers: {
    enter(app) {
      app.watch("timers.status", {}, (t) => {
        if (t.error) {
          $("#timer-summary tbody").replaceChildren(el("tr", {}, el("td", { colspan: 6 }, t.error.message)));
          $("#timer-topics tbody").replaceChildren();
          return;
        }
        const due = t.nextDueMs ? new Date(t.nextDueMs).toLocaleString() : "none within an hour";
        $("#timer-summary tbody").replaceChildren(
          el(
            "tr",
            {},
            el("td", { class: "num", "data-testid": "timer-pending" }, fmtNum(t.pendingTotal)),
            td(fmtNum(t.topicsWithTimers), true),
            el("td", { "data-testid": "timer-next-due" }, due),
            td(fmtNum(t.enqueued), true),
            td(fmtNum(t.delivered), true),
            td(fmtNum(t.dropped), true),
          ),
        );
        $("#timer-topics tbody").replaceChildren(
          ...Object.entries(t.timingCount).map(([topic, m]) => el("tr", {}, td(topic), td(fmtNum(m.count), true))),
        );
      });
    },
  },

  // 5.x clients: the gRPC clients and the messages their POP consumers hold, pushed live.
  grpc: {
    enter(app) {
      app.watch("grpc.status", {}, (g) => {
        if (g.error || !g.grpcEnabled) {
          const text = g.error ? g.error.message : "grpcServerPort is 0: no gRPC port, no 5.x clients";
          $("#grpc-clients tbody").replaceChildren(el("tr", {}, el("td", { colspan: 8 }, text)));
          $("#grpc-inflight tbody").replaceChildren();
          return;
        }
        $("#grpc-clients tbody").replaceChildren(
          ...g.clients.map((c) =>
            el(
              "tr",
              {},
              td(c.clientId),
              td(c.clientAddr),
              td(c.language || "-"),
              td(c.version || "-"),
              td(c.clientType),
              td(c.group || "-"),
              td(c.topics.join(", ") || "-"),
              td(fmtTime(c.lastHeartbeat)),
            ),
          ),
        );
        $("#grpc-inflight tbody").replaceChildren(
          ...g.inflight.map((q) =>
            el(
              "tr",
              {},
              td(q.group),
              td(q.topic),
              td(String(q.queueId), true),
              td(fmtNum(q.inFlight), true),
              td(fmtNum(q.invisible), true),
              td(fmtNum(q.oldestOffset), true),
              td(fmtNum(q.oldestAttempts), true),
              td(`${(q.oldestInvisibleMs / 1000).toFixed(1)} s`, true),
            ),
          ),
        );
      });
    },
  },

  // Broker config: every key; live keys are editable, restart-only keys are not.
  config: {
    wired: false,
    original: {},

    async enter() {
      if (!this.wired) {
        this.wired = true;
        $("#config-filter").addEventListener("input", () => this.filter());
        $("#config-save").addEventListener("click", () => this.save());
      }
      await this.load();
    },

    async load() {
      const data = await channel.request("config.get");
      this.original = data.config;
      const frozen = new Set(data.restartOnly);
      $("#config-table tbody").replaceChildren(
        ...Object.entries(data.config).map(([key, value]) =>
          el(
            "tr",
            { dataset: { key } },
            td(key),
            el("td", {}, frozen.has(key) ? value : el("input", { value, "data-key": key, size: 40 })),
            td(frozen.has(key) ? "restart to change" : ""),
          ),
        ),
      );
      this.filter();
    },

    filter() {
      const needle = $("#config-filter").value.trim().toLowerCase();
      for (const row of document.querySelectorAll("#config-table tbody tr")) {
        row.hidden = needle && !row.dataset.key.toLowerCase().includes(needle);
      }
    },

    async save() {
      const changed = {};
      for (const input of document.querySelectorAll("#config-table input[data-key]")) {
        if (input.value !== this.original[input.dataset.key]) changed[input.dataset.key] = input.value;
      }
      const keys = Object.keys(changed);
      if (!keys.length) return toast("nothing changed");
      const text = keys.map((k) => `${k}=${changed[k]}`).join(", ");
      const done = await act(`Apply ${text} to the running broker?`, () => channel.request("config.update", { config: changed }), "Config updated");
      if (done) await this.load();
    },
  },
};

// ACL accounts: secrets are shown masked by the broker and never sent back unless typed anew.
views.acl = {
  wired: false,

  async enter() {
    if (!this.wired) {
      this.wired = true;
      $("#acl-white-save").addEventListener("click", () => this.saveWhite());
      $("#acl-form").addEventListener("submit", (event) => {
        event.preventDefault();
        this.saveAccount();
      });
      $("#acl-form-reset").addEventListener("click", () => {
        $("#acl-form-title").textContent = "Add an account";
        $("#acl-form").accessKey.readOnly = false;
      });
    }
    await this.load();
  },

  async load() {
    const data = await channel.request("acl.list");
    $("#acl-body").hidden = !data.enabled;
    $("#acl-status").textContent = data.enabled
      ? `${data.accounts.length} accounts from ${data.files.join(", ")}`
      : "ACL is off on this broker (aclEnable=false).";
    if (!data.enabled) return;
    $("#acl-default-file").textContent = data.defaultFile;
    $("#acl-white").value = data.defaultFileWhiteAddrs.join(",");
    $("#acl-table tbody").replaceChildren(
      ...data.accounts.map((a) =>
        el(
          "tr",
          { dataset: { key: a.accessKey } },
          td(a.accessKey),
          td(a.secretKey),
          td(a.whiteRemoteAddress ?? ""),
          td(a.admin ? "yes" : "no"),
          td(a.defaultTopicPerm ?? "DENY"),
          td(a.defaultGroupPerm ?? "DENY"),
          td((a.topicPerms || []).join(", ")),
          td((a.groupPerms || []).join(", ")),
          td(a.file),
          el(
            "td",
            {},
            el("button", { onclick: () => this.edit(a) }, "Edit"),
            " ",
            el("button", { class: "danger", onclick: () => this.remove(a.accessKey) }, "Delete"),
          ),
        ),
      ),
    );
  },

  edit(a) {
    const form = $("#acl-form");
    $("#acl-form-title").textContent = `Edit ${a.accessKey}`;
    form.accessKey.value = a.accessKey;
    form.accessKey.readOnly = true;
    form.secretKey.value = "";
    form.whiteRemoteAddress.value = a.whiteRemoteAddress ?? "";
    form.admin.checked = !!a.admin;
    form.defaultTopicPerm.value = a.defaultTopicPerm ?? "DENY";
    form.defaultGroupPerm.value = a.defaultGroupPerm ?? "DENY";
    form.topicPerms.value = (a.topicPerms || []).join(",");
    form.groupPerms.value = (a.groupPerms || []).join(",");
  },

  async saveAccount() {
    const form = $("#acl-form");
    const params = {
      accessKey: form.accessKey.value.trim(),
      secretKey: form.secretKey.value,
      whiteRemoteAddress: form.whiteRemoteAddress.value.trim(),
      admin: form.admin.checked,
      defaultTopicPerm: form.defaultTopicPerm.value,
      defaultGroupPerm: form.defaultGroupPerm.value,
      topicPerms: form.topicPerms.value,
      groupPerms: form.groupPerms.value,
    };
    const done = await act(`Save ACL account ${params.accessKey}?`, () => channel.request("acl.update", params), "Account saved");
    if (done) {
      form.reset();
      form.accessKey.readOnly = false;
      await this.load();
    }
  },

  async remove(accessKey) {
    const done = await act(`Delete ACL account ${accessKey}?`, () => channel.request("acl.delete", { accessKey }), "Account deleted");
    if (done) await this.load();
  },

  async saveWhite() {
    const list = $("#acl-white").value.split(",").map((s) => s.trim()).filter(Boolean);
    const done = await act(`Set the global white addresses to ${list.join(", ") || "(none)"}?`, () => channel.request("acl.updateGlobalWhiteAddrs", { globalWhiteAddrs: list }), "White addresses saved");
    if (done) await this.load();
  },
};

// -- start ------------------------------------------------------------------------------------

window.addEventListener("resize", () => drawChart());

$("#login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  channel.connect($("#token").value.trim());
});

(function boot() {
  const match = location.hash.match(/token=([^&]+)/);
  const token = match ? decodeURIComponent(match[1]) : sessionStorage.getItem("pymq-token");
  if (match) history.replaceState(null, "", location.pathname); // keep the token out of view
  if (token) channel.connect(token);
  else showLogin();
})();
