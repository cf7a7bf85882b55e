/** Names in the reaper config (backends, pools): they appear in the report and in every listed item. */
export const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;
