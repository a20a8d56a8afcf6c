/**
 * Notices: what the pool did to the user's servers (preempted, kernels stopped,
 * stopped at the floor, idle reclaim), from `GET me`'s `notices`, shown in the
 * panel until dismissed; and the words for a cull that was carried out.
 * The words here are quoted in docs/user-guide.md (tests/test_docs.py compares).
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { ICullWarning, IMe, INotice } from './types';

/** Status bar and panel, after the kernels were shut down while the warning stands. */
export const KERNELS_STOPPED = 'kernels stopped';
/** The panel's line under a carried-out cull. */
export const KERNELS_STOPPED_DETAIL =
  'Your GPUs were taken back; notebooks and files are untouched. New GPU work in this server is stopped: ' +
  'stop the server and start it again to get GPUs.';
/** The dismiss button of a notice. */
export const DISMISS = 'Dismiss';
/** The panel's line under "GPU servers stop at the floor (−10) in ~10 min" (after the local time). */
export const FLOOR_STOP_DETAIL =
  'your balance reaches the floor and servers holding GPUs are stopped; notebooks and files stay on disk. ' +
  'Save your work now; a server without GPUs can still be started.';

/** "At about 14:02, your balance reaches the floor and …". */
export function floorStopDetail(localTime: string): string {
  return `At about ${localTime}, ${FLOOR_STOP_DETAIL}`;
}

/** A notice's time as a researcher reads it: "14:02" today, else "Mon 24 Nov, 14:02" (local time). */
export function noticeTime(iso: string, now: number): string {
  const when = new Date(iso);
  if (Number.isNaN(when.getTime())) {
    return iso;
  }
  const time = when.toLocaleTimeString(undefined, { hour: '2-digit', minute: '2-digit' });
  if (when.toDateString() === new Date(now).toDateString()) {
    return time;
  }
  const day = when.toLocaleDateString(undefined, { weekday: 'short', day: 'numeric', month: 'short' });
  return `${day}, ${time}`;
}

/**
 * A notice's headline with its time: "Your GPU server was stopped at 14:02 because your
 * balance reached the floor (−10 tokens)"; the service's `title` alone from an older service.
 */
export function noticeHeadline(n: Pick<INotice, 'what' | 'because' | 'title' | 'at'>, now: number): string {
  if (!n.what || !n.because) {
    return n.title;
  }
  return `${n.what} at ${noticeTime(n.at, now)} ${n.because}`;
}

/** Whether a cull warning was carried out already (kernels shut down): no countdown then. */
export function cullDone(warning: Pick<ICullWarning, 'done_at'> | null | undefined): boolean {
  return !!warning?.done_at;
}

/** The status bar's flag for notices not dismissed yet ("1 notice"), or ''. */
export function noticeFlag(me: Pick<IMe, 'notices'>): string {
  const n = (me.notices || []).length;
  return n ? `${n} notice${n === 1 ? '' : 's'}` : '';
}

/** Dismiss one notice through the server extension (`DELETE {base_url}gpupool/notices/{id}`). */
export async function dismissNotice(id: number, settings: ServerConnection.ISettings): Promise<boolean> {
  const url = URLExt.join(settings.baseUrl, 'gpupool', 'notices', String(id));
  const response = await ServerConnection.makeRequest(url, { method: 'DELETE' }, settings);
  return response.ok;
}

function node<K extends keyof HTMLElementTagNameMap>(tag: K, className?: string, text?: string) {
  const n = document.createElement(tag);
  if (className) {
    n.className = className;
  }
  if (text !== undefined) {
    n.textContent = text;
  }
  return n;
}

/** One box per notice with its dismiss button; null when there is none. */
export function noticesBox(
  me: Pick<IMe, 'notices'>,
  settings: ServerConnection.ISettings,
  dismissed: () => void
): HTMLElement | null {
  const notices = me.notices || [];
  if (!notices.length) {
    return null;
  }
  const box = node('div', 'gp-BalancePanel-notices');
  box.dataset.gpupool = 'notices';
  for (const n of notices) {
    box.append(noticeRow(n, settings, dismissed));
  }
  return box;
}

function noticeRow(n: INotice, settings: ServerConnection.ISettings, dismissed: () => void): HTMLElement {
  const row = node('div', 'gp-BalancePanel-notice');
  row.dataset.notice = String(n.id);
  row.dataset.kind = n.kind;
  const when = new Date(n.at);
  const at = Number.isNaN(when.getTime()) ? n.at : when.toLocaleString();
  const headline = node('strong', undefined, noticeHeadline(n, Date.now()));
  headline.title = at;
  row.append(headline);
  if (n.server) {
    row.append(node('div', 'gp-BalancePanel-muted', `Server ${n.server}`));
  }
  row.append(node('div', undefined, n.why), node('div', undefined, n.kept));
  const button = node('button', 'jp-mod-styled gp-BalancePanel-dismiss', DISMISS);
  button.dataset.gpupool = 'dismiss';
  button.addEventListener('click', () => {
    button.disabled = true;
    void dismissNotice(n.id, settings)
      .catch(() => false)
      .then(() => dismissed());
  });
  row.append(button);
  return row;
}
