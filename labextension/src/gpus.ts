/**
 * The GPUs at work: utilization and memory of the user's own GPUs, how long a
 * server has been idle and when it may be reclaimed, and the places in the
 * wait queue. Texts here are the ones docs/user-guide.md quotes; the status-bar
 * item and the panel (widget.ts) only place them.
 */
import { formatCountdown, secondsUntil } from './format';
import type { IGpuActivity, IGpuServer, IMe, IWaiting } from './types';

const GIB = 1024 ** 3;

/** "37 %"; "—" when unknown. */
export function formatUtilization(value: number | null | undefined): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return '—';
  }
  return `${Math.round(value * 100)} %`;
}

/** "1.0 / 24.0 GiB"; "—" when unknown. */
export function formatMemory(used: number | null | undefined, total: number | null | undefined): string {
  const gib = (b: number) => (b / GIB).toFixed(1);
  if (used === null || used === undefined) {
    return total ? `? / ${gib(total)} GiB` : '—';
  }
  return total ? `${gib(used)} / ${gib(total)} GiB` : `${gib(used)} GiB`;
}

/** A span of time in words: "<1 min", "45 min", "1 h 5 min", "3 d 2 h". */
export function formatSpan(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 60) {
    return '<1 min';
  }
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) {
    return `${minutes} min`;
  }
  const hours = Math.floor(minutes / 60);
  if (hours < 48) {
    const m = minutes % 60;
    return m ? `${hours} h ${m} min` : `${hours} h`;
  }
  const h = hours % 24;
  return h ? `${Math.floor(hours / 24)} d ${h} h` : `${Math.floor(hours / 24)} d`;
}

/**
 * How idle a server is:
 * "idle 45 min — may be reclaimed in 15 min if someone waits",
 * "idle 2 h — may be reclaimed if someone waits",
 * "idle 2 h — someone is waiting: stops in 4:59";
 * with max_idle, "…; stops in 3 h even if nobody waits". Empty while busy or unknown.
 */
export function formatIdle(server: IGpuServer, now: number): string {
  if (!server.idle_since) {
    return '';
  }
  const idle = `idle ${formatSpan(-secondsUntil(server.idle_since, now))}`;
  if (server.reclaim_deadline) {
    return `${idle} — someone is waiting: stops in ${formatCountdown(server.reclaim_deadline, now)}`;
  }
  const until = secondsUntil(server.reclaimable_at, now);
  let text =
    until > 0
      ? `${idle} — may be reclaimed in ${formatSpan(Math.ceil(until / 60) * 60)} if someone waits`
      : `${idle} — may be reclaimed if someone waits`;
  const stop = secondsUntil(server.max_idle_at, now);
  if (Number.isFinite(stop)) {
    text += stop > 0 ? `; stops in ${formatSpan(Math.ceil(stop / 60) * 60)} even if nobody waits` : '; stops soon';
  }
  return text;
}

/** "1st", "2nd", "3rd", "11th", "22nd". */
export function ordinal(n: number): string {
  const tens = n % 100;
  if (tens >= 11 && tens <= 13) {
    return `${n}th`;
  }
  return `${n}${['th', 'st', 'nd', 'rd'][n % 10] ?? 'th'}`;
}

/** "waiting for 2 × RTX 3090: 1st of 3 in the queue, about 20–45 min" (the range the
 * service learned from the pool's history; without history its point estimate, "about 20 min"). */
export function formatWaiting(w: IWaiting, now: number): string {
  const what = `waiting for ${w.request}`;
  if (w.position === 0) {
    return `${what}: GPUs reserved, starting`;
  }
  const place = w.queue_length > 1 ? `${ordinal(w.position)} of ${w.queue_length}` : ordinal(w.position);
  if (w.eta_basis === 'history' && w.eta_text) {
    return `${what}: ${place} in the queue, ${w.eta_text}`;
  }
  const eta = secondsUntil(w.eta, now);
  const when = Number.isNaN(eta)
    ? 'no estimate yet'
    : eta < 60
      ? 'a GPU should free up within a minute'
      : `about ${formatSpan(Math.ceil(eta / 60) * 60)}`;
  return `${what}: ${place} in the queue, ${when}`;
}

/** One GPU's line: "RTX 3090 #0: 37 %, 1.0 / 24.0 GiB". */
export function formatGpuActivity(g: IGpuActivity): string {
  return `${g.model.replace(/^NVIDIA (GeForce )?/, '')} #${g.index}: ${formatUtilization(
    g.utilization
  )}, ${formatMemory(g.memory_used_bytes, g.memory_total_bytes)}`;
}

/** The short note for the status bar: a reclaim countdown, else the queue place. */
export function statusNote(me: IMe, now: number): string {
  const warned = (me.gpu_servers || []).find(s => s.reclaim_deadline);
  if (warned) {
    return `idle: stops in ${formatCountdown(warned.reclaim_deadline, now)}`;
  }
  const w = (me.waiting || []).find(x => x.position > 0);
  return w ? `queue ${ordinal(w.position)}` : '';
}

/** Whether a countdown runs (the widget then re-renders every second). */
export function hasCountdown(me: IMe | null): boolean {
  return !!me && (me.gpu_servers || []).some(s => s.reclaim_deadline);
}

/** The panel's "GPUs at work" and "Waiting" sections; null when there is nothing to show. */
export function renderActivity(me: IMe, now: number): HTMLElement | null {
  const servers = me.gpu_servers || [];
  const waiting = me.waiting || [];
  if (!servers.length && !waiting.length) {
    return null;
  }
  const box = document.createElement('div');
  box.className = 'gp-Gpus';
  box.dataset.gpupool = 'activity';
  const title = document.createElement('h4');
  title.className = 'gp-BalancePanel-subtitle';
  title.textContent = servers.length ? 'GPUs at work' : 'Waiting for GPUs';
  box.append(title);
  for (const s of servers) {
    const div = document.createElement('div');
    div.className = 'gp-Gpus-server';
    div.dataset.allocation = s.allocation;
    const head = document.createElement('div');
    head.className = 'gp-Gpus-name';
    head.textContent = `Server ${s.server || 'default'}`;
    div.append(head);
    for (const g of s.gpus) {
      const line = document.createElement('div');
      line.className = 'gp-Gpus-gpu';
      line.textContent = formatGpuActivity(g);
      div.append(line);
    }
    const idle = formatIdle(s, now);
    if (idle) {
      const line = document.createElement('div');
      line.className = s.reclaim_deadline ? 'gp-Gpus-idle gp-mod-warn' : 'gp-Gpus-idle';
      line.dataset.gpupool = 'idle';
      line.textContent = idle;
      div.append(line);
    }
    box.append(div);
  }
  for (const w of waiting) {
    const line = document.createElement('div');
    line.className = 'gp-Gpus-waiting';
    line.dataset.gpupool = 'waiting';
    line.textContent = `${w.server ? `Server ${w.server}: ` : ''}${formatWaiting(w, now)}`;
    box.append(line);
  }
  return box;
}
